"""qitos.kit.context: compactors (``compaction``) and the declarative ``ContextPolicy`` (``policy``), each a public
module of its own."""

__all__: list[str] = []
