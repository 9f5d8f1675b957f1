"""qitos.kit.parsers."""
