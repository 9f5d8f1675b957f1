"""qitos.checkpoint: the ``CheckpointStore`` contract (``store``) and its implementations
(``memory_store``, ``sqlite_store``)."""

__all__: list[str] = []
