"""qitos.kit.tools."""
