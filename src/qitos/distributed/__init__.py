"""A fleet of worker processes running sessions from a shared PostgreSQL store, on DBOS (``qitos-kernel[fleet]``)."""

from qitos.distributed._fleet import Fleet, SessionOutcome
from qitos.distributed._naming import load_composition
from qitos.distributed._worker import Worker

__all__ = ["Fleet", "SessionOutcome", "Worker", "load_composition"]
