"""Every install hint names what works for the installation at hand (``qitos.core._install``).

The distribution is ``qitos-kernel`` (the index's ``qitos`` is another project). Each case runs in
a subprocess whose ``sys.path`` starts with a real ``.dist-info`` directory written the way pip
writes one (``METADATA``, and ``direct_url.json`` for a local install), so ``importlib.metadata``
finds that installation first.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from qitos.core._install import DISTRIBUTION, install_command

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _hint_with(site: Path | None, extra: str = "postgres", *, no_site_packages: bool = False) -> str:
    code = (
        "import sys\n"
        "from qitos.core._install import install_command\n"  # imported first: the lookup is at call time
        f"site, drop = {str(site) if site else None!r}, {no_site_packages!r}\n"
        "if drop:\n"
        "    sys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
        "if site:\n"
        "    sys.path.insert(0, site)\n"
        f"print(install_command({extra!r}))\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _installed(tmp_path: Path, direct_url: dict[str, object] | None) -> Path:
    site = tmp_path / "site"
    info = site / "qitos_kernel-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qitos-kernel\nVersion: 0.1.0\n", encoding="utf-8")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url), encoding="utf-8")
    return site


def test_the_distribution_is_named_qitos_kernel_in_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION == "qitos-kernel"
    assert {"postgres", "fleet", "otel", "mcp", "tokens", "local", "docs"} <= set(project["optional-dependencies"])


def test_installed_from_the_index_the_hint_names_qitos_kernel(tmp_path: Path) -> None:
    site = _installed(tmp_path, None)
    assert _hint_with(site) == "pip install 'qitos-kernel[postgres]'"


def test_installed_editable_from_a_checkout_the_hint_installs_that_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "my code" / "qitos"  # a space: the hint quotes it
    site = _installed(tmp_path, {"url": checkout.as_uri(), "dir_info": {"editable": True}})
    hint = _hint_with(site)
    assert hint == f"pip install -e '{checkout}[postgres]'"
    assert shlex.split(hint) == ["pip", "install", "-e", f"{checkout}[postgres]"]


def test_installed_as_a_copy_of_a_checkout_the_hint_has_no_dash_e(tmp_path: Path) -> None:
    site = _installed(tmp_path, {"url": (tmp_path / "qitos").as_uri(), "dir_info": {}})
    assert _hint_with(site, "otel") == f"pip install '{tmp_path / 'qitos'}[otel]'"


def test_installed_from_a_wheel_file_the_hint_names_qitos_kernel(tmp_path: Path) -> None:
    wheel = tmp_path / "qitos_kernel-0.1.0-py3-none-any.whl"
    site = _installed(tmp_path, {"url": wheel.as_uri(), "archive_info": {}})
    assert _hint_with(site, "mcp") == "pip install 'qitos-kernel[mcp]'"


def test_not_installed_but_imported_from_a_checkout_the_hint_names_the_checkout() -> None:
    assert _hint_with(None, "tokens", no_site_packages=True) == f"pip install -e {shlex.quote(f'{ROOT}[tokens]')}"


def test_the_hint_for_this_checkout_is_a_command_pip_accepts() -> None:
    """The hint this test run gets (an editable checkout: CI installs with ``pip install -e``),
    given to pip as printed, resolves to qitos-kernel with the extra (a dry run: nothing installed)."""
    hint = install_command("postgres")
    args = shlex.split(hint)
    assert args[:3] == ["pip", "install", "-e"] and Path(args[3].rsplit("[", 1)[0]).resolve() == ROOT
    pytest.importorskip("hatchling", reason="the dev extra installs hatchling (pip's metadata build)")
    pytest.importorskip("editables", reason="the dev extra installs editables (pip's editable build)")
    command = [sys.executable, "-m", *args[:2], "--dry-run", "--no-deps", "--no-index", "--no-build-isolation"]
    command += ["--quiet", "--report", "-", *args[2:]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (item,) = json.loads(done.stdout)["install"]
    assert item["metadata"]["name"] == "qitos-kernel"
    assert item["requested_extras"] == ["postgres"]
