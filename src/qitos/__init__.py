"""qitos: a Python agent kernel."""
