"""Runs the CheckpointStore conformance suite (conformance.py) against every registered store.

The suite is loaded under a unique module name, so another directory's ``conformance.py`` can
never shadow it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_suite() -> ModuleType:
    """The conformance module, imported once under ``qitos_checkpoint_conformance``."""
    name = "qitos_checkpoint_conformance"
    if name not in sys.modules:
        # Load through pytest's assertion-rewriting hook when present, so failed asserts explain themselves.
        hook = next((f for f in sys.meta_path if type(f).__name__ == "AssertionRewritingHook"), None)
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("conformance.py"), loader=hook)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_suite = load_suite()
store = _suite.store
globals().update({name: value for name, value in vars(_suite).items() if name.startswith("test_")})
