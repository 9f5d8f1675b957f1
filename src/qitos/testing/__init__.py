"""qitos.testing: what a project built on qitos tests itself with.

``CheckpointStoreConformance`` is the suite every ``CheckpointStore`` passes; subclass it with a
``store`` fixture to prove a store of your own. It
needs pytest (``pip install 'qitos-kernel[testing]'``), which ``import qitos`` never imports.
"""

from __future__ import annotations

from qitos.core._install import install_command

try:
    import pytest
except ImportError as exc:
    raise ImportError(f"qitos.testing needs pytest: {install_command('testing')}") from exc

# Imported through pytest's assertion rewriting, so a failed check in the suite shows its values.
pytest.register_assert_rewrite("qitos.testing._conformance")

from qitos.testing._conformance import CheckpointStoreConformance  # noqa: E402

__all__ = ["CheckpointStoreConformance"]
