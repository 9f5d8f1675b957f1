"""The README's layout is the repository's: every package of ``src/qitos`` is listed, and the
dependency table says exactly what each package imports, in an order where every import points
down (read from the source with ``ast``, imports inside functions included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import qitos

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(qitos.__file__).resolve().parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())


def _layout_section() -> str:
    return README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]


def _stated_dependencies() -> dict[str, set[str]]:
    """The table's rows (``name → a, b`` or ``name → (nothing)``), in the order they are listed."""
    rows = re.findall(r"^([a-z_]+) +→ (.+)$", _layout_section(), re.M)
    return {name: set() if deps == "(nothing)" else set(deps.split(", ")) for name, deps in rows}


def _actual_dependencies() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                found[package].update(n.split(".")[1] for n in names if n.startswith("qitos."))
        found[package].discard(package)
    return found


def test_the_layout_lists_every_package() -> None:
    listed = set(re.findall(r"^src/qitos/([a-z_]+)/", _layout_section(), re.M))
    assert listed == set(PACKAGES)


def test_the_dependency_table_is_what_each_package_imports() -> None:
    stated = _stated_dependencies()
    assert set(stated) == set(PACKAGES)
    assert stated == _actual_dependencies()


def test_every_dependency_points_down_the_table() -> None:
    order = list(_stated_dependencies())
    upward = [
        f"{package} → {dependency}"
        for package, dependencies in _actual_dependencies().items()
        for dependency in dependencies
        if order.index(dependency) <= order.index(package)
    ]
    assert upward == []
