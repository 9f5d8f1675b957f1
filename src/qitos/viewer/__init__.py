"""qitos.viewer."""
