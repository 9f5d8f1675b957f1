"""qitos.kit.tools: workspace file tools, the shell tool and the MCP toolset."""

__all__: list[str] = []
