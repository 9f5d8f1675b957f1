"""qitos.kit.context: compactors (``compaction``) and the declarative ``ContextPolicy`` (``policy``)."""

__all__: list[str] = []
