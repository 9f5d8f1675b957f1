"""The documentation site builds from the repository with warnings as errors (``mkdocs build
--strict``): every page in the nav exists, every API reference page resolves against the
docstrings, every link inside the site resolves. Its code blocks run in ``tests/test_readme.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import qitos

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    try:
        import mkdocstrings  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("the docs extra (mkdocs, mkdocstrings) must be installed in CI")
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(qitos.__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("guides/sessions/index.html", "guides/fleet/index.html", "reference/sessions/index.html"):
        assert page in built, sorted(built)
    session_api = (site / "reference" / "sessions" / "index.html").read_text(encoding="utf-8")
    assert 'id="qitos.engine.session_runtime.Session.approve"' in session_api  # generated from the docstrings
