"""Replay evaluation and the response cache: recorded replies answer a new eval's model requests.

The live model is an OpenAI-compatible server on 127.0.0.1 (``chat_server.ScriptServer``) that
counts every request it answers: "no model call" is what the server saw.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_server import ScriptServer
from replay_agents import Prompted, Reworded, ToolsChanged

from qitos.checkpoint._packing import pack_or_raw, unpack
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.eval import Dataset, EvalChangedError, ReplaySourceError, Sample, evaluate, open_eval_store, scorers
from qitos.eval._recording import recorded_calls
from qitos.models import FunctionModel, OpenAICompatibleModel

WORDS = ("alpha one", "beta two", "gamma three")


def _data(words: tuple[str, ...] = WORDS, *, name: str = "words") -> Dataset:
    return Dataset([Sample(w, w.upper(), id=f"s{i}") for i, w in enumerate(words)], name=name)


@pytest.fixture
def server() -> Iterator[ScriptServer]:
    with ScriptServer() as running:
        yield running


def _model(server: ScriptServer) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(model="m", base_url=server.url, api_key="k")


def _recorded(db: Path, eval_name: str) -> dict[str, list[Any]]:
    """Per sample of an eval: the ``served_from`` of every reply its session recorded."""
    _, eval_store = open_eval_store(str(db))
    record = eval_store.find_eval(eval_name)
    assert record is not None
    store = SqliteCheckpointStore(str(db))
    return {
        r.sample_id: [c.response.served_from for c in recorded_calls(store, r.session_id)]
        for r in eval_store.results(record.eval_id)
    }


def _live(db: Path, server: ScriptServer, name: str = "live", **kwargs: Any) -> Any:
    return evaluate(
        Prompted, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name=name, **kwargs
    )


def test_replaying_an_unchanged_agent_makes_no_model_call_and_gives_the_same_results(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "evals.db"
    live = _live(db, server)
    assert live.metrics["exact"]["mean"] == 1.0 and server.calls == 9
    again = evaluate(
        Prompted, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="again", replay="live"
    )
    assert server.calls == 9  # nothing reached the server
    assert [(s.id, s.answer, s.steps, s.divergence) for s in again.samples] == [
        (s.id, s.answer, s.steps, None) for s in live.samples
    ]
    assert again.metrics["exact"]["mean"] == 1.0 and again.pins["replay"]["on_divergence"] == "stop"
    # every reply in the new sessions' request records says where it came from
    assert _recorded(db, "again") == {sid: ["replay"] * 3 for sid in ("s0", "s1", "s2")}
    assert _recorded(db, "live") == {sid: [None] * 3 for sid in ("s0", "s1", "s2")}


def test_a_changed_system_prompt_diverges_at_the_first_request_and_mark_goes_on_with_recorded_replies(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    report = evaluate(
        Reworded,
        _data(),
        scorers=[scorers.exact()],
        model=_model(server),
        store=str(db),
        name="reworded",
        replay="live",
        on_divergence="mark",
    )
    assert server.calls == 9  # the 9 of the live run, none more
    assert report.metrics["exact"]["mean"] == 1.0 and report.status == "complete"
    for sample in report.samples:
        divergence = sample.divergence
        assert divergence is not None and divergence["step"] == 0 and divergence["call"] == 1
        assert divergence["diff"] == {
            "system": {
                "line": 2,
                "recorded": "Use the tools, then answer in upper case.",
                "now": "Use the tools, then answer in UPPER CASE only.",
            }
        }
        assert divergence["action"] == "answered from the recording"
        assert divergence["recorded_digest"] != divergence["request_digest"]
    assert report.to_dict()["samples"][0]["divergence"]["step"] == 0


def test_stop_fails_a_diverged_sample_without_retrying_it(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    report = evaluate(
        Reworded, _data(), scorers=[scorers.exact()], store=str(db), name="stopped", replay="live", retries=2
    )
    assert server.calls == 9
    assert report.failed == 3 and report.metrics["exact"]["n"] == 0
    for sample in report.samples:
        assert sample.attempts == 1  # a replay diverges the same way every time: no retry
        assert sample.error is not None and "replay diverged at step 0 (model call #1): system changed" in sample.error
        assert sample.divergence is not None and sample.divergence["action"] == "stopped"


def test_live_goes_on_against_the_model_from_the_diverging_request(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    report = evaluate(
        Reworded,
        _data(),
        scorers=[scorers.exact()],
        model=_model(server),
        store=str(db),
        name="went-live",
        replay="live",
        on_divergence="live",
    )
    assert server.calls == 18  # every request of every sample, from the first (where each diverged)
    assert report.metrics["exact"]["mean"] == 1.0
    assert all(
        s.divergence is not None and s.divergence["action"] == "continued against the live model"
        for s in report.samples
    )
    assert _recorded(db, "went-live") == {sid: [None] * 3 for sid in ("s0", "s1", "s2")}


def test_a_divergence_names_added_tools(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    report = evaluate(
        ToolsChanged,
        _data(),
        scorers=[scorers.exact()],
        store=str(db),
        name="tools",
        replay="live",
        on_divergence="mark",
    )
    assert server.calls == 9
    assert report.samples[0].divergence is not None
    assert report.samples[0].divergence["diff"] == {"tools": {"added": ["count"]}}


def test_replay_with_epochs_answers_each_epoch_from_its_own_recording(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    seen: list[int] = []

    def reply(messages: list[dict[str, Any]]) -> str:
        seen.append(1)
        return f"answer {len(seen)}"

    first = evaluate(
        Prompted,
        _data(WORDS[:2]),
        scorers=[scorers.includes()],
        model=FunctionModel(reply, takes="messages"),
        store=str(db),
        name="epochs",
        epochs=2,
    )
    assert len(seen) == 4
    again = evaluate(
        Prompted,
        _data(WORDS[:2]),
        scorers=[scorers.includes()],
        model=FunctionModel(reply, takes="messages"),
        store=str(db),
        name="epochs-again",
        epochs=2,
        replay="epochs",
    )
    assert len(seen) == 4
    assert [(s.id, s.epoch, s.answer) for s in again.samples] == [(s.id, s.epoch, s.answer) for s in first.samples]
    assert len({s.answer for s in again.samples}) == 4  # each epoch got its own recorded reply


def test_the_response_cache_answers_a_repeated_request_and_marks_the_hit(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server, name="cached", cache=True)
    assert server.calls == 9
    other = _live(db, server, name="cached-again", cache=True)
    assert server.calls == 9  # every request was in the cache
    assert other.metrics["exact"]["mean"] == 1.0
    assert _recorded(db, "cached-again") == {sid: ["cache"] * 3 for sid in ("s0", "s1", "s2")}
    # a changed system prompt is another request: the cache misses, and caches the new replies
    evaluate(Reworded, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="r1", cache=True)
    assert server.calls == 18
    # the cache is keyed by the model too: another model name misses
    evaluate(
        Prompted,
        _data(),
        scorers=[scorers.exact()],
        model=OpenAICompatibleModel(model="other", base_url=server.url, api_key="k"),
        store=str(db),
        name="other-model",
        cache=True,
    )
    assert server.calls == 27
    _, eval_store = open_eval_store(str(db))
    assert eval_store.clear_cache() == 27
    _live(db, server, name="after-clear", cache=True)
    assert server.calls == 36


def test_without_cache_every_request_reaches_the_model(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server, name="cached", cache=True)
    _live(db, server, name="uncached")
    assert server.calls == 18


def test_replay_and_cache_together_answer_diverged_requests_from_the_cache(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    kwargs: dict[str, Any] = {"replay": "live", "on_divergence": "live", "cache": True}
    evaluate(Reworded, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="a", **kwargs)
    assert server.calls == 18
    report = evaluate(
        Reworded, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="b", **kwargs
    )
    assert server.calls == 18 and report.metrics["exact"]["mean"] == 1.0
    assert _recorded(db, "b") == {sid: ["cache"] * 3 for sid in ("s0", "s1", "s2")}


# --------------------------------------------------------------------------- judges


def _judge(calls: list[str]) -> FunctionModel:
    def grade(messages: list[dict[str, Any]]) -> str:
        calls.append(messages[-1]["content"])
        return "Looks right.\nGRADE: C"

    return FunctionModel(grade, takes="messages", model_id="judge")


def test_a_model_graded_scorer_replays_its_judge(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    calls: list[str] = []
    live = evaluate(
        Prompted,
        _data(),
        scorers=[scorers.model_graded(_judge(calls))],
        model=_model(server),
        store=str(db),
        name="judged",
    )
    assert len(calls) == 3 and live.metrics["model_graded"]["mean"] == 1.0
    again = evaluate(
        Prompted,
        _data(),
        scorers=[scorers.model_graded(_judge(calls))],
        model=_model(server),
        store=str(db),
        name="judged-again",
        replay="judged",
    )
    assert len(calls) == 3 and server.calls == 9  # neither the agent's model nor the judge was called
    assert again.metrics["model_graded"]["mean"] == 1.0
    _, eval_store = open_eval_store(str(db))
    record = eval_store.find_eval("judged-again")
    assert record is not None
    judged = [s.metadata["judge"] for s in eval_store.scores(record.eval_id)]
    assert [j["response"].get("served_from") for j in judged] == ["replay"] * 3


def test_a_changed_judge_template_diverges_and_stop_records_a_scoring_error(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "evals.db"
    calls: list[str] = []
    evaluate(
        Prompted,
        _data(),
        scorers=[scorers.model_graded(_judge(calls))],
        model=_model(server),
        store=str(db),
        name="judged",
    )
    template = "Grade this answer to {input}: {answer}. End with GRADE: C or GRADE: I."
    report = evaluate(
        Prompted,
        _data(),
        scorers=[scorers.model_graded(_judge(calls), template=template, version="2")],
        model=_model(server),
        store=str(db),
        name="judged-2",
        replay="judged",
    )
    assert len(calls) == 3  # the judge was not asked
    assert report.metrics["model_graded"]["errors"] == 3
    assert "replay diverged" in str(report.samples[0].scores["model_graded"]["error"])


def test_a_cached_judge_is_asked_once_per_request(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    calls: list[str] = []
    for name in ("j1", "j2"):
        evaluate(
            Prompted,
            _data(),
            scorers=[scorers.model_graded(_judge(calls))],
            model=_model(server),
            store=str(db),
            name=name,
            cache=True,
        )
    assert len(calls) == 3 and server.calls == 9


# --------------------------------------------------------------------------- bad input


def test_replaying_from_an_eval_that_does_not_exist_is_refused_naming_it(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    with pytest.raises(ReplaySourceError, match=r"cannot replay from eval 'nope': there is no such eval .*live"):
        evaluate(Prompted, _data(), scorers=[scorers.exact()], store=str(db), name="x", replay="nope")
    _, eval_store = open_eval_store(str(db))
    assert eval_store.find_eval("x") is None  # nothing was created


def test_replaying_from_an_eval_with_other_samples_is_refused_naming_them(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    more = Dataset([*_data(), Sample("delta four", "DELTA FOUR", id="s9")], name="words")
    with pytest.raises(ReplaySourceError, match=r"it has no sample 's9' \(1 of this eval's 4 samples\)"):
        evaluate(Prompted, more, scorers=[scorers.exact()], store=str(db), name="x", replay="live")
    changed = Dataset([Sample("alpha ONE", "ALPHA ONE", id="s0")], name="words")
    with pytest.raises(ReplaySourceError, match=r"sample 's0' has another input there"):
        evaluate(Prompted, changed, scorers=[scorers.exact()], store=str(db), name="y", replay="live")
    with pytest.raises(ReplaySourceError, match=r"no result for 's0' \(epoch 2\)"):
        evaluate(Prompted, _data(), scorers=[scorers.exact()], store=str(db), name="z", replay="live", epochs=2)
    assert server.calls == 9


def test_a_damaged_recording_fails_its_sample_with_an_integrity_error_naming_the_row(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "evals.db"
    live = _live(db, server)
    damaged = live.samples[1].session_id
    with sqlite3.connect(db) as conn:
        # the snapshot that committed the first step keeps its model call in the step's summary
        rows = conn.execute(
            "SELECT snapshot_id, encoding, payload FROM snapshots WHERE session_id = ? ORDER BY sequence", (damaged,)
        ).fetchall()
        texts = {sid: unpack(payload).decode() if encoding == "zstd" else payload for sid, encoding, payload in rows}
        snapshot_id = next(sid for sid, text in texts.items() if '"model":' in text and '"lookup"' in text)
        encoding = next(e for sid, e, _ in rows if sid == snapshot_id)
        text = texts[snapshot_id].replace('"lookup"', '"remove"')
        stored = pack_or_raw(text.encode()) if encoding == "zstd" else text
        conn.execute("UPDATE snapshots SET payload = ? WHERE snapshot_id = ?", (stored, snapshot_id))
    report = evaluate(
        Prompted,
        _data(),
        scorers=[scorers.exact()],
        model=_model(server),
        store=str(db),
        name="replayed",
        replay="live",
        on_divergence="live",
    )
    assert server.calls == 9  # the damaged sample got no reply at all: not a wrong one, not a live one
    by_id = {s.id: s for s in report.samples}
    error = by_id["s1"].error
    assert error is not None and "IntegrityError" in error and f"snapshots row {snapshot_id}" in error
    assert by_id["s0"].error is None and by_id["s2"].error is None  # the others went on


def test_resuming_a_replay_eval_without_the_replay_is_refused(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    evaluate(Prompted, _data(), scorers=[scorers.exact()], store=str(db), name="rp", replay="live")
    with pytest.raises(EvalChangedError, match=r"replay"):
        evaluate(Prompted, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="rp")


def test_replay_needs_no_model_but_a_diverged_live_sample_does(tmp_path: Path, server: ScriptServer) -> None:
    db = tmp_path / "evals.db"
    _live(db, server)
    report = evaluate(
        Reworded, _data(), scorers=[scorers.exact()], store=str(db), name="nolive", replay="live", on_divergence="live"
    )
    assert server.calls == 9
    error = report.samples[0].error
    assert error is not None and "no recorded or cached reply and no live model" in error


def test_bad_replay_arguments_are_refused(tmp_path: Path) -> None:
    from qitos.core._errors import ConfigurationError

    db = str(tmp_path / "evals.db")
    with pytest.raises(ConfigurationError, match="on_divergence must be one of stop, live, mark"):
        evaluate(Prompted, _data(), scorers=[scorers.exact()], store=db, replay="x", on_divergence="ignore")
    with pytest.raises(ConfigurationError, match="replay= names an earlier eval"):
        evaluate(Prompted, _data(), scorers=[scorers.exact()], store=db, replay="")


# An eval written before a step's summary held its model call (schema 3, by main at 7b6cfe3): its
# calls are in its decision writes, which the migration keeps.
OLD_EVAL = Path(__file__).with_name("golden") / "replay_schema3.db"


def test_an_eval_stored_before_step_summaries_held_model_calls_replays_from_its_kept_writes(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(OLD_EVAL, db)
    report = evaluate(
        Prompted, _data(), scorers=[scorers.exact()], model=_model(server), store=str(db), name="again", replay="live"
    )
    assert server.calls == 0  # every reply came from the old recording
    assert [(s.id, s.answer, s.steps, s.divergence) for s in report.samples] == [
        (f"s{i}", w.upper(), 3, None) for i, w in enumerate(WORDS)
    ]
    assert _recorded(db, "live") == {sid: [None] * 3 for sid in ("s0", "s1", "s2")}
    with sqlite3.connect(db) as conn:  # the old rows were kept; the new eval's steps wrote none that stayed
        kinds = conn.execute("SELECT kind, COUNT(*) FROM writes GROUP BY kind ORDER BY kind").fetchall()
    assert kinds == [("decision", 9), ("tool_started", 3)]


def test_a_damaged_decision_write_of_an_old_eval_fails_its_sample_naming_the_row(
    tmp_path: Path, server: ScriptServer
) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(OLD_EVAL, db)
    with sqlite3.connect(db) as conn:
        damaged, text = conn.execute(
            "SELECT session_id, payload FROM writes WHERE kind = 'decision' AND step_id = 0"
            ' AND payload LIKE \'%"word":"beta"%\''  # sample s1's first call
        ).fetchone()
        assert '"lookup"' in text
        conn.execute(
            "UPDATE writes SET payload = ? WHERE session_id = ? AND kind = 'decision' AND step_id = 0",
            (text.replace('"lookup"', '"remove"'), damaged),
        )
    report = evaluate(
        Prompted,
        _data(),
        scorers=[scorers.exact()],
        model=_model(server),
        store=str(db),
        name="replayed",
        replay="live",
        on_divergence="live",
    )
    assert server.calls == 0  # the damaged sample got no reply at all: not a wrong one, not a live one
    by_id = {s.id: s for s in report.samples}
    error = by_id["s1"].error
    assert error is not None and "IntegrityError" in error and "writes" in error and "decision/decision" in error
    assert damaged in error
    assert by_id["s0"].error is None and by_id["s2"].error is None


def test_a_replay_killed_midway_resumes_where_its_sample_stood(tmp_path: Path, server: ScriptServer) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from replay_agents import GATE_FILE, STEP_GATE, Gated

    import qitos
    from qitos.eval._runner import eval_id_for, session_id_for

    db = tmp_path / "evals.db"
    live = _live(db, server)
    marker = tmp_path / "waiting"
    code = (
        "from replay_agents import Gated\n"
        "from qitos.eval import Dataset, Sample, evaluate, scorers\n"
        f"data = Dataset([Sample(w, w.upper(), id=f's{{i}}') for i, w in enumerate({list(WORDS)!r})], name='words')\n"
        f"evaluate(Gated, data, scorers=[scorers.exact()], store={str(db)!r}, name='resumed', replay='live', "
        "max_samples=1)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(qitos.__file__).resolve().parents[1]), str(Path(__file__).parent)])
    env[GATE_FILE] = str(marker)
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():  # the first sample got its first reply, ran its tool, and waits
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    first = session_id_for(eval_id_for("resumed"), "s0", 1)
    assert len(recorded_calls(SqliteCheckpointStore(str(db)), first)) == 1  # killed after its first reply
    STEP_GATE.set()
    report = evaluate(Gated, _data(), scorers=[scorers.exact()], store=str(db), name="resumed", replay="live")
    assert server.calls == 9 and report.status == "complete"
    assert [(s.id, s.answer, s.divergence) for s in report.samples] == [(s.id, s.answer, None) for s in live.samples]
    # the reply the first sample got before the kill was not asked for again: 3 per session in all
    assert _recorded(db, "resumed") == {sid: ["replay"] * 3 for sid in ("s0", "s1", "s2")}


def _replied(store: SqliteCheckpointStore, sessions: list[str]) -> int:
    return sum(len(recorded_calls(store, s)) for s in sessions if store.get_session_head(s) is not None)


def test_a_replay_cancelled_midway_runs_the_cancelled_idempotent_call_again_and_does_not_diverge(
    tmp_path: Path, server: ScriptServer
) -> None:
    import asyncio

    from replay_agents import LOOKUP_GATE, SlowPrompted

    from qitos.eval import aevaluate
    from qitos.eval._runner import eval_id_for, session_id_for

    db = tmp_path / "evals.db"
    _live(db, server)
    options: dict[str, Any] = {"scorers": [scorers.exact()], "store": str(db), "name": "cancelled"}
    options.update(replay="live", on_divergence="mark")
    sessions = [session_id_for(eval_id_for("cancelled"), f"s{i}", 1) for i in range(3)]
    store = SqliteCheckpointStore(str(db))

    async def interrupted() -> None:
        task = asyncio.ensure_future(aevaluate(SlowPrompted, _data(), **options))
        while _replied(store, sessions) < 3:
            await asyncio.sleep(0.05)
        task.cancel()  # Ctrl-C: the steps stop at a boundary; their pending calls get no result
        with pytest.raises(asyncio.CancelledError):
            await task

    LOOKUP_GATE.clear()
    try:
        asyncio.run(interrupted())
    finally:
        LOOKUP_GATE.set()
    report = evaluate(SlowPrompted, _data(), **options)
    assert server.calls == 9 and report.status == "complete"
    # the cancelled step's call (idempotent) runs again on resume and its result reaches the model: the
    # next request is the recorded one (it carries the lookup's result), so nothing diverges
    assert [(s.id, s.answer, s.divergence) for s in report.samples] == [
        (f"s{i}", w.upper(), None) for i, w in enumerate(WORDS)
    ]
    assert _recorded(db, "cancelled") == {sid: ["replay"] * 3 for sid in ("s0", "s1", "s2")}
