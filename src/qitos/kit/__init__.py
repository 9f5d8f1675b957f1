"""qitos.kit."""
