#!/usr/bin/env bash
# The static checks, the same in CI (scripts/test.sh) and before a commit (.pre-commit-config.yaml):
# ruff over the code, the tests, the benchmarks and the examples, then mypy --strict as configured
# in pyproject.toml (src/, tests/, examples/). Every conftest.py below tests/ is the module
# "conftest" to mypy, so each is checked on its own.
#   bash scripts/check.sh [ruff|mypy]      (both when not named; tools from $QITOS_BIN, default .venv/bin)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${QITOS_BIN:-.venv/bin}
what=${1:-all}
case "$what" in all | ruff | mypy) ;; *) echo "usage: bash scripts/check.sh [ruff|mypy]" >&2; exit 2 ;; esac

if [ "$what" != mypy ]; then
    "$BIN/ruff" check --no-cache src tests bench examples
fi
if [ "$what" != ruff ]; then
    "$BIN/mypy"
    for conftest in tests/*/conftest.py; do
        "$BIN/mypy" --no-error-summary "$conftest"
    done
fi
