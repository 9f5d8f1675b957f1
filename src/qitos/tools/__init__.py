"""qitos.tools: everything for giving an agent tools, in one place.

``tool`` and ``ToolRegistry`` (also at the root), the workspace file tools and the shell tool, and
the MCP toolset, which loads on first access because it needs the ``qitos-kernel[mcp]`` extra::

    from qitos.tools import ToolRegistry, tool, workspace_tools, shell_tool
    from qitos.tools import MCPToolset            # imports the mcp SDK now
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qitos.core._tool import ToolRegistry, ToolResult, ToolSpec, tool
from qitos.kit.tools._files import WorkspacePathError, workspace_tools
from qitos.kit.tools._shell import shell_tool

if TYPE_CHECKING:  # for type checkers and the API reference; at run time they load on first access
    from qitos.kit.tools._mcp import MCPConnectionError, MCPToolError, MCPToolset

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

_LAZY = dict.fromkeys(("MCPConnectionError", "MCPToolError", "MCPToolset"), "qitos.kit.tools._mcp")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
