"""qitos.models."""
