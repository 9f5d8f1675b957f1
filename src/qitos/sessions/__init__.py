"""Durable sessions' storage side: the snapshot format, its writer and reader, the step journal.

Depends on ``qitos.checkpoint`` and ``qitos.core`` only. The ``Session`` facade that runs the engine
lives in ``qitos.engine.session_runtime``, above this package.
"""
