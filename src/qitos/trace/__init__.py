"""qitos.trace."""
