"""How to install an extra of qitos, said the way that works for this installation.

The distribution is ``qitos-kernel`` (the import name stays ``qitos``: the package index's ``qitos``
is an unrelated project). Every hint that tells a user to install something comes from
:func:`install_command`, so it names what the user actually has:

- qitos installed from a local checkout (``pip install -e /src/qitos``): the distribution's
  ``direct_url.json`` names that directory, and the hint is ``pip install -e '/src/qitos[postgres]'``
  (without ``-e`` for a checkout installed as a copy);
- qitos not installed at all but imported from a checkout's ``src/`` (``PYTHONPATH=src``): the same
  form, naming that checkout;
- otherwise (installed from the index): ``pip install 'qitos-kernel[postgres]'``.
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

__all__ = ["DISTRIBUTION", "install_command", "local_source"]

DISTRIBUTION = "qitos-kernel"
"""The name qitos is installed under (``pip install qitos-kernel``; ``import qitos``)."""

# src/qitos/core/_install.py -> the checkout holding src/
_CHECKOUT = Path(__file__).resolve().parents[3]


def install_command(extra: str | None = None) -> str:
    """The ``pip install`` command that adds ``extra`` (or qitos itself) to this installation."""
    source = local_source()
    if source is None:
        target = f"{DISTRIBUTION}[{extra}]" if extra else DISTRIBUTION
        return f"pip install {shlex.quote(target) if extra else target}"
    path, editable = source
    target = f"{path}[{extra}]" if extra else str(path)
    return f"pip install {'-e ' if editable else ''}{shlex.quote(target)}"


def local_source() -> tuple[Path, bool] | None:
    """The local directory qitos was installed from and whether editably, or None (the index).

    Read from the installed distribution's ``direct_url.json`` (PEP 610); when no distribution is
    installed, a checkout whose ``src/`` holds the running code counts as an editable source.
    """
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return (_CHECKOUT, True) if _is_checkout(_CHECKOUT) else None
    try:
        info = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        return None
    url = urlsplit(info["url"])
    dir_info = info.get("dir_info")
    if url.scheme != "file" or not isinstance(dir_info, dict):
        return None  # an archive or a VCS URL: installing the extra from the index is what works
    path = Path(url2pathname(url.path))
    return path, bool(dir_info.get("editable"))


def _is_checkout(root: Path) -> bool:
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
    except (OSError, ValueError):
        return False
    return isinstance(project, dict) and project.get("name") == DISTRIBUTION
