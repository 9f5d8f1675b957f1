"""The qitos web viewer: runs, sessions and model requests in the browser.

Start it with ``qitos trace serve`` or :class:`ViewerServer`.
"""

from qitos.viewer._server import ViewerServer

__all__ = ["ViewerServer"]
