"""qitos.kit.memory: ``MemdirMemory``, ``MarkdownFileMemory`` and ``MemorySourceAdapter``."""

__all__: list[str] = []
