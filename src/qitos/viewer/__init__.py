"""The qitos web viewer: runs, sessions and model requests in the browser.

Start it with ``qitos trace serve`` or :class:`qitos.viewer.server.ViewerServer`. The JSON views
it serves are built in :mod:`qitos.viewer.data`.
"""

__all__: list[str] = []
