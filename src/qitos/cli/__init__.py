"""The ``qitos`` command (typer + rich); the entry point is :func:`qitos.cli.app.main` and the
commands live in private modules.

typer and rich are imported only here, never by ``import qitos``.
"""

__all__: list[str] = []
