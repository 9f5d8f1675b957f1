"""qitos.models: model adapters.

The contract and the offline doubles import eagerly (they need nothing beyond the standard
library); the network and embedded adapters load on first access, so ``import qitos.models``
never pulls in ``httpx`` or ``cyllama``::

    from qitos.models import ScriptedModel                 # light
    from qitos.models import OpenAICompatibleModel         # imports httpx now
    from qitos.models import LocalModel                    # imports cyllama now
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qitos.models._base import ModelAdapter, ModelResponse, ToolCall, Usage
from qitos.models._function import FunctionModel
from qitos.models._scripted import ReplayDivergenceError, ReplayModel, ScriptedModel

if TYPE_CHECKING:  # for type checkers and the API reference; at run time they load on first access
    from qitos.models._local import LocalModel
    from qitos.models._openai_compat import OpenAICompatibleModel

__all__ = [
    "FunctionModel",
    "LocalModel",
    "ModelAdapter",
    "ModelResponse",
    "OpenAICompatibleModel",
    "ReplayDivergenceError",
    "ReplayModel",
    "ScriptedModel",
    "ToolCall",
    "Usage",
]

_LAZY = {"OpenAICompatibleModel": "qitos.models._openai_compat", "LocalModel": "qitos.models._local"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
