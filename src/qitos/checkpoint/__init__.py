"""qitos.checkpoint: the ``CheckpointStore`` contract (``store``) and its implementations
(``memory_store``, ``sqlite_store``, ``postgres_store`` with ``postgres_sql``), and ``targets``,
which opens a store from the text naming it (a path, ``sqlite:///...`` or a ``postgresql://`` DSN)."""

__all__: list[str] = []
