"""qitos.checkpoint."""
