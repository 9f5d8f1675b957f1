"""Share of type annotations in ``src/qitos`` that involve ``Any``, overall and per package.

Run: python scripts/any_share.py [--root src/qitos] [--list PACKAGE]

An annotation is a parameter's or a return's annotation of a function, or the annotation of an
annotated assignment (``x: T = ...``, class fields included). It involves ``Any`` when the name
``Any`` (or ``typing.Any``) appears anywhere in it: ``Any``, ``dict[str, Any]``, ``Decision[Any]``.
String annotations are parsed the same way. ``self`` and ``cls`` carry no annotation and are not
counted. ``--list PACKAGE`` prints each annotation involving ``Any`` in that package with its place.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Annotation:
    """One annotation found in a source file."""

    path: Path
    line: int
    text: str
    has_any: bool


def _mentions_any(node: ast.expr) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "Any":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "Any":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                inner = ast.parse(sub.value, mode="eval").body
            except SyntaxError:
                continue
            if _mentions_any(inner):
                return True
    return False


def _annotations_of(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            if args.vararg is not None:
                every.append(args.vararg)
            if args.kwarg is not None:
                every.append(args.kwarg)
            for arg in every:
                if arg.annotation is not None:
                    yield arg.annotation
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def scan(root: Path) -> list[Annotation]:
    """Every annotation under ``root`` (``.py`` files), in file order."""
    found: list[Annotation] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for annotation in _annotations_of(tree):
            found.append(
                Annotation(
                    path=path,
                    line=annotation.lineno,
                    text=ast.unparse(annotation),
                    has_any=_mentions_any(annotation),
                )
            )
    return found


def package_of(path: Path, root: Path) -> str:
    """The top-level package under ``root`` a file belongs to (``(top)`` for ``root``'s own files)."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else "(top)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "src" / "qitos")
    parser.add_argument("--list", metavar="PACKAGE", help="print the annotations involving Any in PACKAGE")
    options = parser.parse_args(argv)
    root: Path = options.root
    if not root.is_dir():
        print(f"no such directory: {root}", file=sys.stderr)
        return 2
    found = scan(root)
    if options.list:
        for item in found:
            if item.has_any and package_of(item.path, root) == options.list:
                print(f"{item.path.relative_to(root)}:{item.line}: {item.text}")
        return 0
    per: dict[str, list[int]] = {}
    for item in found:
        counts = per.setdefault(package_of(item.path, root), [0, 0])
        counts[0] += 1
        counts[1] += item.has_any
    print(f"{'package':<14}{'annotations':>12}{'with Any':>10}{'share':>9}")
    for name in sorted(per):
        total, with_any = per[name]
        print(f"{name:<14}{total:>12}{with_any:>10}{with_any / total:>8.1%}")
    total = len(found)
    with_any = sum(item.has_any for item in found)
    print(f"{'all':<14}{total:>12}{with_any:>10}{with_any / total:>8.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
