"""qitos.cli."""
