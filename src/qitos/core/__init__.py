"""qitos.core: contracts only."""
