"""``scripts/any_share.py``: the share of annotations that involve ``Any``, per package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "any_share.py"


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True)
    return done.stdout


def test_counts_parameters_returns_and_fields_per_package(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "top.py").write_text("from typing import Any\nx: int = 1\n")
    (pkg / "inner" / "mod.py").write_text(
        "import typing\n"
        "from typing import Any\n"
        "def f(self, a: Any, b: int, *c: 'dict[str, Any]', **d: object) -> typing.Any: ...\n"
        "class C:\n"
        "    field: list[Any]\n"
        "    other: str\n"
    )
    out = _run("--root", str(pkg))
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    # inner: a, b, c, d, the return, field, other = 7 annotations; a, c (a string), the return, field use Any
    assert rows["inner"] == ["7", "4", "57.1%"]
    assert rows["(top)"] == ["1", "0", "0.0%"]
    assert rows["all"] == ["8", "4", "50.0%"]
    listed = _run("--root", str(pkg), "--list", "inner").splitlines()
    assert listed == [
        "inner/mod.py:3: Any",
        "inner/mod.py:3: 'dict[str, Any]'",
        "inner/mod.py:3: typing.Any",
        "inner/mod.py:5: list[Any]",
    ]


def test_a_missing_root_is_reported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path / "nowhere")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no such directory" in done.stderr
