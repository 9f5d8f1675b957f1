"""The conformance suite as a store written outside qitos uses it: one import, one fixture, pytest.

Each test writes a test module into an empty directory and runs pytest on it in a subprocess, so
the suite is collected the way a third party's project would collect it (not through this
repository's conftest or test paths).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import qitos
from qitos.testing import CheckpointStoreConformance

_SRC = str(Path(qitos.__file__).resolve().parent.parent)
TESTS = sum(name.startswith("test_") for name in dir(CheckpointStoreConformance))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_SRC, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _pytest(tmp_path: Path, module: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_my_store.py").write_text(textwrap.dedent(module), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "test_my_store.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_store_of_ones_own_passes_every_test_of_the_suite_with_one_import(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        """
        import pytest

        from qitos.checkpoint import SqliteCheckpointStore
        from qitos.testing import CheckpointStoreConformance


        class MyStore(SqliteCheckpointStore):
            pass


        class TestMyStore(CheckpointStoreConformance):
            @pytest.fixture
            def store(self, tmp_path):
                with MyStore(tmp_path / "sessions.db") as store:
                    yield store
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert TESTS >= 50 and f"{TESTS} passed" in done.stdout, done.stdout


def test_a_store_that_breaks_the_contract_fails_the_tests_it_breaks_showing_the_values(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        """
        import pytest

        from qitos.checkpoint import InMemoryCheckpointStore
        from qitos.testing import CheckpointStoreConformance


        class OldestFirst(InMemoryCheckpointStore):
            # The contract lists a session's snapshots newest first.
            def list_session_snapshots(self, session_id):
                return list(reversed(super().list_session_snapshots(session_id)))


        class TestOldestFirst(CheckpointStoreConformance):
            @pytest.fixture
            def store(self):
                with OldestFirst() as store:
                    yield store
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED test_my_store.py::TestOldestFirst::test_a_sessions_snapshots_are_listed_newest_first" in done.stdout
    # pytest rewrote the suite's asserts: the failure shows both lists, not a bare AssertionError.
    assert "assert ['" in done.stdout and "== ['" in done.stdout, done.stdout
    assert " passed" in done.stdout  # the rest of the contract still holds and says so


def test_a_subclass_without_a_store_fixture_is_told_to_define_one(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        """
        from qitos.testing import CheckpointStoreConformance


        class TestForgotten(CheckpointStoreConformance):
            pass
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{TESTS} errors" in done.stdout, done.stdout
    assert "TestForgotten must define a `store` fixture yielding a fresh, empty CheckpointStore" in done.stdout


def test_a_fixture_yielding_a_used_store_or_no_store_is_refused_before_any_test_runs(tmp_path: Path) -> None:
    done = _pytest(
        tmp_path,
        """
        import pytest

        from qitos.checkpoint import InMemoryCheckpointStore
        from qitos.checkpoint.store import SessionSnapshot, SessionSnapshotCommit
        from qitos.testing import CheckpointStoreConformance

        SHARED = InMemoryCheckpointStore()
        FIRST = SessionSnapshot.create(session_id="left-over", parent_id=None, base_id=None, sequence=0, payload={})
        SHARED.commit_session_snapshot(
            SessionSnapshotCommit(session_id="left-over", expected_head=None, snapshot=FIRST, lifecycle="created")
        )


        class TestShared(CheckpointStoreConformance):
            @pytest.fixture
            def store(self):
                return SHARED


        class TestPath(CheckpointStoreConformance):
            @pytest.fixture
            def store(self, tmp_path):
                return tmp_path / "sessions.db"
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{2 * TESTS} errors" in done.stdout, done.stdout
    assert "TestShared.store must yield an empty store; it already holds sessions ['left-over']" in done.stdout
    assert "TestPath.store must yield a CheckpointStore, got PosixPath" in done.stdout
    assert " passed" not in done.stdout and " failed" not in done.stdout  # no test ran against either store


def test_without_pytest_the_import_says_what_to_install() -> None:
    code = "import sys; sys.modules['pytest'] = None; import qitos.testing"
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ImportError: qitos.testing needs pytest: pip install" in done.stderr, done.stderr
    assert "[testing]" in done.stderr, done.stderr
