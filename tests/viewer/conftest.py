"""Viewer test fixtures: the data of :mod:`viewer_support`, built once per module, and a live server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from viewer_support import ViewerData, build_viewer_data, get

from qitos.viewer._server import ViewerServer


@pytest.fixture(scope="module")
def viewer_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewerData]:
    """Runs and sessions to display (the in-progress run is finished at teardown)."""
    data = build_viewer_data(tmp_path_factory.mktemp("viewer"))
    yield data
    data.live_writer.finish("completed", {"stop_reason": "final", "steps": 1})


@pytest.fixture(scope="module")
def server(viewer_data: ViewerData) -> Iterator[ViewerServer]:
    with ViewerServer(str(viewer_data.logdir), db=str(viewer_data.db), port=0) as srv:
        yield srv


@pytest.fixture
def api(server: ViewerServer) -> Any:
    """``api(path)`` -> (status, headers, body) against the module's viewer."""
    return lambda path, **kw: get(server, path, **kw)
