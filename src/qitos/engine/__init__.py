"""qitos.engine."""
