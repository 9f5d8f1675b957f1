"""qitos.eval's face: its exported names, its layer, and what importing it loads."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import qitos
import qitos.eval

NAMES = {
    "CompareError": "qitos.eval._compare",
    "Comparison": "qitos.eval._compare",
    "compare": "qitos.eval._compare",
    "Dataset": "qitos.eval._dataset",
    "DatasetError": "qitos.eval._dataset",
    "EvalChangedError": "qitos.eval._runner",
    "EvalProgress": "qitos.eval._runner",
    "EvalReport": "qitos.eval._report",
    "EvalStore": "qitos.eval._store",
    "ReplaySourceError": "qitos.eval._replay",
    "Sample": "qitos.eval._dataset",
    "SampleReport": "qitos.eval._report",
    "SampleResult": "qitos.eval._result",
    "Score": "qitos.eval.scorers",
    "Scorer": "qitos.eval.scorers",
    "ScorerError": "qitos.eval.scorers",
    "ScoringError": "qitos.eval.scorers",
    "aevaluate": "qitos.eval",
    "evaluate": "qitos.eval",
    "open_eval_store": "qitos.eval._store",
    "scorers": "qitos.eval",
}


def test_the_face_exports_exactly_its_sorted_names() -> None:
    assert list(qitos.eval.__all__) == sorted(NAMES)
    for name, home in NAMES.items():
        assert getattr(qitos.eval, name) is getattr(importlib.import_module(home), name), name
    assert qitos.eval.scorers is importlib.import_module("qitos.eval.scorers")
    assert sorted(qitos.eval.scorers.__all__) == list(qitos.eval.scorers.__all__)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.startswith("qitos.")}


def test_eval_sits_above_the_engine_and_below_the_cli() -> None:
    root = Path(qitos.__file__).parent
    upward = {
        str(path.relative_to(root)): sorted(n for n in _imports(path) if n.startswith(("qitos.cli", "qitos.viewer")))
        for path in (root / "eval").glob("*.py")
    }
    assert {k: v for k, v in upward.items() if v} == {}
    below = [p for p in root.rglob("*.py") if p.parts[len(root.parts)] not in ("eval", "cli", "viewer")]
    reaching = {str(p.relative_to(root)) for p in below if any(n.startswith("qitos.eval") for n in _imports(p))}
    assert reaching == set()


def test_importing_qitos_eval_loads_no_optional_dependency() -> None:
    code = (
        "import json, sys; import qitos.eval; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'dbos', 'sqlalchemy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []
