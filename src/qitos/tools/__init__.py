"""qitos.tools: everything for giving an agent tools, in one place.

``tool`` and ``ToolRegistry`` (defined in ``qitos.core._tool``), the workspace file tools and the
shell tool (``qitos.kit.tools``), and the MCP toolset, which loads on first access because it needs
the ``qitos-kernel[mcp]`` extra::

    from qitos.tools import ToolRegistry, tool, workspace_tools, shell_tool
    from qitos.tools import MCPToolset            # imports the mcp SDK now

The modules named by the seeds and SPEC (``qitos.core._tool``, ``qitos.kit.tools.files`` ...) stay
where they are; these are the same objects.
"""

from __future__ import annotations

import importlib
from typing import Any

from qitos.core._tool import ToolRegistry, ToolResult, ToolSpec, tool
from qitos.kit.tools.files import WorkspacePathError, workspace_tools
from qitos.kit.tools.shell import shell_tool

__all__ = [
    "MCPConnectionError",
    "MCPToolError",
    "MCPToolset",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "WorkspacePathError",
    "shell_tool",
    "tool",
    "workspace_tools",
]

_LAZY = dict.fromkeys(("MCPConnectionError", "MCPToolError", "MCPToolset"), "qitos.kit.tools.mcp")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
