"""qitos.kit.tools: workspace file tools, the shell tool and the MCP toolset (public through
``qitos.tools``)."""

__all__: list[str] = []
