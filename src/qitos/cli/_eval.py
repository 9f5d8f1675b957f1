"""``qitos eval``: run an agent over a dataset, list, show, rescore and resume evals.

::

    qitos eval run DATASET --agent MODULE:CLASS [--model openai:NAME --base-url URL] [--scorer NAME ...]
                   [--epochs K] [--max-samples M] [--limit N] [--name NAME] [--db STORE] [--json]
    qitos eval list [--db STORE] [--json]
    qitos eval show EVAL [--group-by FIELD] [--db STORE] [--json]
    qitos eval score EVAL --scorer NAME [...] [--db STORE] [--json]
    qitos eval resume EVAL [--db STORE] [--json]
    qitos eval run ... --replay EVAL [--on-divergence stop|live|mark] [--cache]
    qitos eval cache clear [--db STORE]
    qitos eval compare A B [--allow-different-datasets] [--db STORE] [--json]
    qitos eval export EVAL OUT.eval --format inspect [--db STORE]

``DATASET`` is a ``.jsonl`` or ``.csv`` file or ``module:attribute`` naming a ``Dataset``; ``EVAL``
an eval id or name; ``--db`` the store of sessions and results (a SQLite file, default
``evals.db``, or a ``postgresql://`` URL). Scorer names: ``exact``, ``includes``, ``numeric``
(``numeric:TOLERANCE``), ``choice``, ``pattern:REGEX``, ``tool_calls`` (against each sample's
target), ``model_graded`` (judged by ``--model``) or ``module:attribute`` naming a scorer. An eval
run from this command records how it was started, so ``qitos eval resume`` can continue it.

``--replay EVAL`` answers every model request from the replies recorded in that earlier eval (the
same sample and epoch) with no model call, and reports where a sample's requests diverged from the
recorded ones; ``--cache`` answers repeated requests from the store's response cache (``qitos eval
cache clear`` empties it). ``qitos eval score`` takes both for a model-graded scorer's judge.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from qitos.checkpoint._targets import describe_target, is_postgres_target, store_exists
from qitos.cli._agents import load_agent
from qitos.cli._common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    cli_command,
    console,
    fail,
    print_json,
    shown_command,
)
from qitos.cli._models import MODEL_FORMS, resolve_model
from qitos.cli._running import require_model
from qitos.eval import CompareError, Comparison, Dataset, EvalProgress, EvalReport, compare, open_eval_store, scorers
from qitos.eval._replay import ON_DIVERGENCE, ReplayPlan
from qitos.eval._report import build_report
from qitos.eval._runner import EvalRun, score_result
from qitos.eval._store import ScorerRecord
from qitos.eval.benchmarks import Benchmark
from qitos.eval.scorers import Scorer

__all__ = ["app", "load_dataset", "scorer_from_name"]

app = typer.Typer(help="Evaluate agents on datasets: run, list, show, score, resume.")

DEFAULT_EVAL_DB = "evals.db"
DbOption = Annotated[
    str, typer.Option("--db", help="Where sessions and results live: a SQLite file or a postgresql:// URL.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print only the report, as JSON.")]
ScorerOption = Annotated[
    list[str] | None,
    typer.Option(
        "--scorer",
        help="A scorer: exact, includes, numeric[:TOL], choice, pattern:REGEX, tool_calls, "
        "model_graded or module:attribute (repeat for more).",
    ),
]
GroupOption = Annotated[str | None, typer.Option("--group-by", help="Break the metrics down by this metadata field.")]
ReplayOption = Annotated[
    str | None,
    typer.Option(
        "--replay", metavar="EVAL", help="Answer model requests from this earlier eval's recorded replies (no calls)."
    ),
]
DivergenceOption = Annotated[
    str,
    typer.Option(
        "--on-divergence",
        help="When a request differs from the recorded one: stop (the sample fails as diverged), live (go on "
        "against --model) or mark (go on with the recorded replies, flagged).",
    ),
]
CacheOption = Annotated[
    bool, typer.Option("--cache", help="Answer repeated model requests from the store's response cache.")
]


def load_dataset(spec: str) -> Dataset:
    """A ``.jsonl``/``.csv`` path, or ``module:attribute`` naming a Dataset or a benchmark (or a
    function returning one)."""
    return load_benchmark(spec)[0]


def load_benchmark(spec: str) -> tuple[Dataset, Benchmark | None]:
    """What ``DATASET`` names: its Dataset, and the Benchmark it came from (its agent and scorers)."""
    lowered = spec.lower()
    if lowered.endswith(".jsonl"):
        return Dataset.from_jsonl(spec), None
    if lowered.endswith(".csv"):
        return Dataset.from_csv(spec), None
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        fail(f"a dataset is a .jsonl or .csv file or module:attribute, got {spec!r}", EXIT_USAGE)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        fail(f"cannot load the dataset {spec!r}: {exc}", EXIT_USAGE)
    if callable(target) and not isinstance(target, Dataset | Benchmark):
        target = target()
    if isinstance(target, Benchmark):
        return target.dataset, target
    if not isinstance(target, Dataset):
        fail(f"{spec} is a {type(target).__name__}, not a qitos.eval.Dataset", EXIT_USAGE)
    return target, None


def scorer_from_name(name: str, *, model: Any = None) -> Scorer:
    """The scorer a ``--scorer`` value names (see the module docs)."""
    kind, sep, rest = name.partition(":")
    if kind == "exact" and not sep:
        return scorers.exact()
    if kind == "includes" and not sep:
        return scorers.includes()
    if kind == "choice" and not sep:
        return scorers.choice()
    if kind == "tool_calls" and not sep:
        return scorers.tool_calls()
    if kind == "numeric":
        try:
            return scorers.numeric(float(rest) if sep else 0)
        except ValueError:
            fail(f"--scorer numeric:TOLERANCE takes a number, got {rest!r}", EXIT_USAGE)
    if kind == "pattern" and sep:
        return scorers.pattern(rest)
    if kind == "model_graded" and not sep:
        if model is None:
            fail("--scorer model_graded needs a judge: give --model", EXIT_USAGE)
        return scorers.model_graded(model)
    if sep and kind not in ("pattern", "numeric", "model_graded", "exact", "includes", "choice", "tool_calls"):
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            target: Any = importlib.import_module(kind)
            for part in rest.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            fail(f"cannot load the scorer {name!r}: {exc}", EXIT_USAGE)
        if not isinstance(target, Scorer) and callable(target):
            target = target()
        if isinstance(target, Scorer):
            return target
        fail(f"{name} is a {type(target).__name__}, not a scorer", EXIT_USAGE)
    fail(
        f"unknown scorer {name!r}: use exact, includes, numeric[:TOL], choice, pattern:REGEX, tool_calls, "
        "model_graded or module:attribute",
        EXIT_USAGE,
    )


@app.command("run")
@cli_command
def run(
    dataset: Annotated[str, typer.Argument(help="A .jsonl/.csv file or module:attribute naming a Dataset.")],
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent", help="The agent: module:Class (an AgentModule class or factory); a benchmark brings its own."
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help=f"Model: {MODEL_FORMS}.")] = None,
    base_url: Annotated[str | None, typer.Option(help="API root for --model openai:NAME (ends in /v1).")] = None,
    max_input_units: Annotated[int | None, typer.Option(min=1, help="Declared context window of the model.")] = None,
    scorer: ScorerOption = None,
    epochs: Annotated[int, typer.Option(min=1, help="Runs per sample.")] = 1,
    max_samples: Annotated[int, typer.Option(min=1, help="Samples in flight at once.")] = 64,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N samples.")] = None,
    sample_timeout: Annotated[float | None, typer.Option(min=0.001, help="Seconds a sample may take.")] = None,
    retries: Annotated[int, typer.Option(min=0, help="New attempts for a failed sample.")] = 0,
    fail_on_error: Annotated[
        float | None, typer.Option(help="Stop once this many samples (>= 1) or this share of them (< 1) failed.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="The eval's name (the same name again continues it).")] = None,
    group_by: GroupOption = None,
    fleet: Annotated[
        bool, typer.Option("--fleet", help="Run the samples on the fleet's workers (needs a postgresql:// --db).")
    ] = False,
    replay: ReplayOption = None,
    on_divergence: DivergenceOption = "stop",
    cache: CacheOption = False,
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Run an agent over a dataset and score it (live progress, then the score table)."""
    _check_divergence(on_divergence)
    data, bench = load_benchmark(dataset)
    factory = _agent(agent, bench)
    adapter = resolve_model(model, base_url=base_url, max_input_units=max_input_units)
    if replay is None or on_divergence == "live":  # a replay answers from its recording, without a model
        require_model(factory(), adapter, what="qitos eval run")
    names = scorer or ([] if bench is not None else ["exact"])
    chosen = [scorer_from_name(n, model=adapter) for n in names] or list(bench.scorers if bench else ())
    spec = {
        "dataset": dataset,
        "agent": agent,
        "model": model,
        "base_url": base_url,
        "max_input_units": max_input_units,
        "scorers": names,
        "epochs": epochs,
        "limit": limit,
        "sample_timeout": sample_timeout,
        "retries": retries,
        "replay": replay,
        "on_divergence": on_divergence,
        "cache": cache,
    }
    _make_parent(db)
    the_fleet = _fleet(factory, adapter, db) if fleet else None
    evaluation = EvalRun(
        factory,
        data,
        scorers=chosen,
        model=adapter,
        store=db,
        name=name,
        epochs=epochs,
        max_samples=max_samples,
        limit=limit,
        sample_timeout=sample_timeout,
        retries=retries,
        fail_on_error=_fail_on_error(fail_on_error),
        fleet=the_fleet,
        spec=spec,
        group_by=group_by,
        replay=replay,
        on_divergence=on_divergence,
        cache=cache,
    )
    _execute(evaluation, json_out)


@app.command("resume")
@cli_command
def resume(
    eval_ref: Annotated[str, typer.Argument(metavar="EVAL", help="The eval's id or name.")],
    max_samples: Annotated[int, typer.Option(min=1, help="Samples in flight at once.")] = 64,
    fail_on_error: Annotated[
        float | None, typer.Option(help="Stop once this many samples (>= 1) or this share of them (< 1) failed.")
    ] = None,
    group_by: GroupOption = None,
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Continue an eval started by ``qitos eval run``: finished samples are read, the rest go on."""
    _, eval_store = _open(db)
    record = eval_store.find_eval(eval_ref)
    if record is None:
        fail(f"no eval {eval_ref!r} in {describe_target(db)}", EXIT_NOT_FOUND)
    spec = record.spec
    if not spec:
        fail(
            f"eval {record.name!r} was started from Python, not by qitos eval run; continue it by calling "
            f"evaluate(..., name={record.name!r}) again with the same arguments",
            EXIT_USAGE,
        )
    bench = load_benchmark(str(spec["dataset"]))[1] if not spec.get("agent") or not spec.get("scorers") else None
    factory = _agent(spec.get("agent"), bench)
    adapter = resolve_model(
        spec.get("model"), base_url=spec.get("base_url"), max_input_units=spec.get("max_input_units")
    )
    names = spec.get("scorers") or ([] if bench is not None else ["exact"])
    chosen = [scorer_from_name(str(n), model=adapter) for n in names] or list(bench.scorers if bench else ())
    samples = eval_store.samples(record.eval_id)
    from qitos.eval import Sample

    data = Dataset([Sample.from_dict(s) for s in samples], name=(record.pins.get("dataset") or {}).get("name"))
    evaluation = EvalRun(
        factory,
        data,
        scorers=chosen,
        model=adapter,
        store=db,
        name=record.name,
        epochs=int(spec.get("epochs") or 1),
        max_samples=max_samples,
        limit=spec.get("limit"),
        sample_timeout=spec.get("sample_timeout"),
        retries=int(spec.get("retries") or 0),
        fail_on_error=_fail_on_error(fail_on_error),
        spec=spec,
        group_by=group_by,
        replay=spec.get("replay"),
        on_divergence=str(spec.get("on_divergence") or "stop"),
        cache=bool(spec.get("cache")),
    )
    eval_store.close()
    _execute(evaluation, json_out)


@app.command("list")
@cli_command
def list_evals(db: DbOption = DEFAULT_EVAL_DB, json_out: JsonOption = False) -> None:
    """List the evals in the store, oldest first."""
    _, eval_store = _open(db)
    rows = []
    for record in eval_store.list_evals():
        report = build_report(eval_store, record)
        rows.append(
            {
                "eval_id": record.eval_id,
                "name": record.name,
                "status": record.status,
                "created_at": record.created_at,
                "agent": record.pins.get("agent"),
                "dataset": (record.pins.get("dataset") or {}).get("name"),
                "done": len(report.samples),
                "total": report.total_samples * report.epochs,
                "metrics": {k: v["mean"] for k, v in report.metrics.items()},
            }
        )
    if json_out:
        print_json(rows)
        return
    out = console()
    if not rows:
        out.print(f"no evals in {describe_target(db)}")
        return
    table = Table("name", "eval id", "status", "agent", "dataset", "done", "scores", "created")
    for row in rows:
        scores = ", ".join(f"{k} {_fmt(v)}" for k, v in row["metrics"].items())
        table.add_row(
            row["name"],
            row["eval_id"],
            row["status"],
            str(row["agent"]),
            str(row["dataset"]),
            f"{row['done']}/{row['total']}",
            scores,
            row["created_at"][:19],
        )
    out.print(table)


@app.command("show")
@cli_command
def show(
    eval_ref: Annotated[str, typer.Argument(metavar="EVAL", help="The eval's id or name.")],
    group_by: GroupOption = None,
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Show an eval's report: metrics per scorer and every sample x epoch."""
    _, eval_store = _open(db)
    record = eval_store.find_eval(eval_ref)
    if record is None:
        fail(f"no eval {eval_ref!r} in {describe_target(db)}", EXIT_NOT_FOUND)
    report = build_report(eval_store, record, group_by=group_by)
    if json_out:
        print_json(report.to_dict())
        return
    out = console()
    out.print(_summary(report))
    replayed = any(s.divergence is not None for s in report.samples)
    columns = ["sample", "epoch", "answer", *report.metrics, "steps", "tokens", "seconds", "error"]
    samples = Table(*columns, *(["replay"] if replayed else []))
    for sample in report.samples:
        values = [_value(sample.scores.get(k)) for k in report.metrics]
        row = [
            sample.id,
            str(sample.epoch),
            _clip(sample.answer),
            *values,
            str(sample.steps),
            str(sample.total_tokens),
            f"{sample.wall_seconds:.2f}",
            _clip(sample.error),
        ]
        if replayed:
            row.append(_divergence(sample.divergence))
        samples.add_row(*row)
    out.print(samples)


@app.command("score")
@cli_command
def score(
    eval_ref: Annotated[str, typer.Argument(metavar="EVAL", help="The eval's id or name.")],
    scorer: ScorerOption = None,
    model: Annotated[str | None, typer.Option(help="The judge of model_graded: " + MODEL_FORMS)] = None,
    base_url: Annotated[str | None, typer.Option(help="API root for --model openai:NAME.")] = None,
    replay: Annotated[
        str | None,
        typer.Option(
            "--replay",
            metavar="EVAL",
            help="Answer the judge from the replies it gave in this eval (e.g. EVAL itself).",
        ),
    ] = None,
    on_divergence: DivergenceOption = "stop",
    cache: CacheOption = False,
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Score an eval's stored results with more scorers (or again): no agent and no model call
    (a model_graded scorer calls only its judge, and not even it with --replay or a --cache hit)."""
    if not scorer:
        fail("name at least one --scorer", EXIT_USAGE)
    _check_divergence(on_divergence)
    _, eval_store = _open(db)
    record = eval_store.find_eval(eval_ref)
    if record is None:
        fail(f"no eval {eval_ref!r} in {describe_target(db)}", EXIT_NOT_FOUND)
    judge = resolve_model(model, base_url=base_url)
    chosen = [scorer_from_name(n, model=judge) for n in scorer]
    from qitos.eval import Sample

    samples = {str(s["id"]): Sample.from_dict(s) for s in eval_store.samples(record.eval_id)}
    plan = None
    if replay is not None or cache:
        checkpoint_store, _ = _open(db)
        plan = ReplayPlan.load(
            checkpoint_store,
            eval_store,
            replay=replay,
            samples=list(samples.values()),
            epochs=int(record.pins.get("epochs", 1)),
            on_divergence=on_divergence,
            cache=cache,
        )
    for each in chosen:
        for sample in samples.values():
            each.check_target(sample)
    eval_store.put_scorers(
        [
            ScorerRecord(
                eval_id=record.eval_id, scorer_id=s.scorer_id, version=s.version, reducer=s.reducer, spec=s.spec
            )
            for s in chosen
        ]
    )

    async def rescore() -> None:
        for result in eval_store.results(record.eval_id):
            if result.error is None:
                if plan is None:
                    records = await score_result(record.eval_id, samples[result.sample_id], result, chosen)
                else:
                    judged, judges = plan.judges(chosen, result.sample_id, result.epoch)
                    scored = await score_result(record.eval_id, samples[result.sample_id], result, judged)
                    records = plan.mark_judged(scored, judges)
                eval_store.put_scores(records, replace=True)

    asyncio.run(rescore())
    report = build_report(eval_store, record, scorers={s.scorer_id: s for s in chosen})
    if json_out:
        print_json(report.to_dict())
        return
    console().print(_summary(report))


@app.command("compare")
@cli_command
def compare_evals(
    first: Annotated[str, typer.Argument(metavar="A", help="The first eval's id or name (the baseline).")],
    second: Annotated[str, typer.Argument(metavar="B", help="The second eval's id or name.")],
    allow_different_datasets: Annotated[
        bool,
        typer.Option(
            "--allow-different-datasets", help="Compare evals of different datasets (only shared samples are paired)."
        ),
    ] = False,
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Compare eval B with eval A: paired differences with 95% intervals, McNemar's exact test,
    flipped samples with both sessions, samples only one has, unstable samples, tokens and time."""
    checkpoint_store, eval_store = _open(db)
    for ref in (first, second):
        if eval_store.find_eval(ref) is None:
            fail(f"no eval {ref!r} in {describe_target(db)}", EXIT_NOT_FOUND)
    try:
        result = compare(first, second, store=checkpoint_store, allow_different_datasets=allow_different_datasets)
    except CompareError as exc:
        fail(str(exc), EXIT_USAGE)
    if json_out:
        print_json(result.to_dict())
        return
    console().print(_comparison(result))


@app.command("export")
@cli_command
def export(
    eval_ref: Annotated[str, typer.Argument(metavar="EVAL", help="The eval's id or name.")],
    out: Annotated[str, typer.Argument(metavar="OUT", help="The file to write (OUT.eval for inspect).")],
    format: Annotated[
        str, typer.Option("--format", help="The log format: inspect (inspect_ai's .eval log).")
    ] = "inspect",
    db: DbOption = DEFAULT_EVAL_DB,
    json_out: JsonOption = False,
) -> None:
    """Write an eval in another tool's log format: inspect_ai's (open it with inspect view)."""
    if format != "inspect":
        fail(f"--format takes inspect, got {format!r}", EXIT_USAGE)
    checkpoint_store, eval_store = _open(db)
    if eval_store.find_eval(eval_ref) is None:
        fail(f"no eval {eval_ref!r} in {describe_target(db)}", EXIT_NOT_FOUND)
    from qitos.eval._inspect import export_inspect

    written = export_inspect(eval_ref, out, store=checkpoint_store)
    if json_out:
        print_json({"eval": eval_ref, "format": format, "path": str(written)})
        return
    console().print(f"wrote eval {eval_ref} as an inspect_ai log: {written}")


cache_app = typer.Typer(help="The response cache of model replies (--cache) in a store.")
app.add_typer(cache_app, name="cache")


@cache_app.command("clear")
@cli_command
def cache_clear(db: DbOption = DEFAULT_EVAL_DB, json_out: JsonOption = False) -> None:
    """Drop every cached model reply of the store (the next --cache run asks the model again)."""
    _, eval_store = _open(db)
    dropped = eval_store.clear_cache()
    if json_out:
        print_json({"cleared": dropped})
        return
    console().print(
        f"cleared {dropped} cached model {'reply' if dropped == 1 else 'replies'} from {describe_target(db)}"
    )


# --------------------------------------------------------------------------- helpers


def _agent(spec: str | None, bench: Benchmark | None) -> Any:
    if spec is not None:
        return load_agent(spec)
    if bench is None:
        fail("name the agent with --agent module:Class (only a benchmark brings its own)", EXIT_USAGE)
    return bench.agent


def _check_divergence(value: str) -> None:
    if value not in ON_DIVERGENCE:
        fail(f"--on-divergence takes {', '.join(ON_DIVERGENCE)}, got {value!r}", EXIT_USAGE)


def _open(db: str) -> Any:
    if not store_exists(db):
        fail(f"no store at {db}", EXIT_NOT_FOUND)
    return open_eval_store(db)


def _make_parent(db: str) -> None:
    if not is_postgres_target(db):
        parent = os.path.dirname(os.path.abspath(db))
        os.makedirs(parent, exist_ok=True)


def _fail_on_error(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(value) if value >= 1 and float(value).is_integer() else value


def _fleet(factory: Any, adapter: Any, db: str) -> Any:
    if not is_postgres_target(db):
        fail("--fleet needs the fleet's PostgreSQL database as --db postgresql://...", EXIT_USAGE)
    from qitos.distributed._fleet import Fleet
    from qitos.engine._composition import compose

    return Fleet(compose(agent=factory, model=adapter), db=db)


def _execute(evaluation: EvalRun, json_out: bool) -> None:
    progress = evaluation.progress
    try:
        if json_out:
            report = asyncio.run(evaluation.arun())
        else:
            out = console()
            with Live(
                get_renderable=lambda: _live(evaluation, progress), console=out, refresh_per_second=4, transient=True
            ):
                report = asyncio.run(evaluation.arun())
    except KeyboardInterrupt:
        fail(
            f"interrupted: eval {evaluation.name!r} is incomplete; its samples stopped at a step boundary",
            130,
            hint="continue it with: "
            + shown_command("qitos", "eval", "resume", evaluation.name, db=evaluation_db(evaluation)),
        )
    finally:
        if evaluation.fleet is not None:
            evaluation.fleet.close()
    if json_out:
        print_json(report.to_dict())
    else:
        console().print(_summary(report))
    if report.status == "failed":
        raise typer.Exit(EXIT_FAILED)


def evaluation_db(evaluation: EvalRun) -> str:
    """The store an eval run writes to, for messages (a SQLite path or a URL without password)."""
    store = evaluation.eval_store
    path = getattr(store, "path", None)
    return describe_target(path if isinstance(path, str) else str(getattr(store, "dsn", "")))


def _live(evaluation: EvalRun, progress: EvalProgress) -> Any:
    elapsed = time.monotonic() - progress.started_at
    fresh = progress.done - progress.skipped
    remaining = progress.total - progress.done
    eta = f"{elapsed / fresh * remaining:.0f}s" if fresh else "-"
    width = 30
    filled = int(width * progress.done / progress.total) if progress.total else 0
    bar = Text("█" * filled + "░" * (width - filled), style="cyan")
    mean = progress.score_mean
    line = Text.assemble(
        (f"{evaluation.name} ", "bold"),
        bar,
        f" {progress.done}/{progress.total} done · {progress.running} running · ",
        (f"{progress.failed} failed", "red" if progress.failed else ""),
        f" · {progress.retried} retried · ",
        f"{progress.scorer_id} {_fmt(mean)} · {progress.tokens:,} tokens · {elapsed:.1f}s elapsed · ETA {eta}",
    )
    return Group(line)


def _summary(report: EvalReport) -> Any:
    table = Table("scorer", "mean", "stderr", "95% CI", "n", "errors", "reducer", title=f"eval {report.name}")
    for name, metric in report.metrics.items():
        ci = metric.get("ci95")
        table.add_row(
            name,
            _fmt(metric["mean"]),
            _fmt(metric["stderr"]),
            f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "-",
            str(metric["n"]),
            str(metric["errors"]),
            str(metric["reducer"]),
        )
    for group, metrics in report.groups.items():
        for name, metric in metrics.items():
            table.add_row(
                f"{name} ({report.group_by}={group})",
                _fmt(metric["mean"]),
                _fmt(metric["stderr"]),
                "-" if not metric.get("ci95") else f"[{_fmt(metric['ci95'][0])}, {_fmt(metric['ci95'][1])}]",
                str(metric["n"]),
                str(metric["errors"]),
                str(metric["reducer"]),
            )
    total = report.total_samples * report.epochs
    line = Text(
        f"{report.status}: {len(report.samples)}/{total} samples x epochs done, {report.failed} failed, "
        f"{report.retried} retried, {report.total_tokens:,} tokens, {report.wall_seconds:.1f}s of sample time "
        f"(eval id {report.eval_id})"
    )
    return Group(table, line)


def _comparison(result: Comparison) -> Any:
    a, b = result.a, result.b
    title = f"eval {b['name']} (B) against {a['name']} (A)"
    table = Table("scorer", "n", "A", "B", "B - A", "95% CI", "McNemar p", "pass->fail", "fail->pass", title=title)
    for name, entry in result.scorers.items():
        ci = entry.get("ci95")
        mcnemar = entry.get("mcnemar")
        flips = entry["flips"]
        table.add_row(
            name,
            str(entry["n"]),
            _fmt(entry["mean_a"]),
            _fmt(entry["mean_b"]),
            _signed(entry["difference"]),
            f"[{_signed(ci[0])}, {_signed(ci[1])}]" if ci else "-",
            f"{mcnemar['p_value']:.4g}" if mcnemar else "-",
            str(len(flips["pass_to_fail"])) if mcnemar else "-",
            str(len(flips["fail_to_pass"])) if mcnemar else "-",
        )
    lines: list[Any] = [table]
    for name, entry in result.scorers.items():
        for kind, label in (("pass_to_fail", "pass -> fail"), ("fail_to_pass", "fail -> pass")):
            for flip in entry["flips"][kind]:
                lines.append(
                    Text(
                        f"{name}: {flip['id']} {label}  A {', '.join(flip['a_sessions'])}  "
                        f"B {', '.join(flip['b_sessions'])}"
                    )
                )
        for side in ("a", "b"):
            if entry["unstable"][side]:
                lines.append(
                    Text(f"{name}: unstable across epochs in {side.upper()}: {', '.join(entry['unstable'][side])}")
                )
        if entry["unscored"]:
            lines.append(Text(f"{name}: not scored on both sides: {', '.join(entry['unscored'])}"))
    if result.only_a:
        lines.append(Text(f"only in A ({len(result.only_a)}): {', '.join(result.only_a)}"))
    if result.only_b:
        lines.append(Text(f"only in B ({len(result.only_b)}): {', '.join(result.only_b)}"))
    if not result.same_dataset:
        lines.append(Text(f"different datasets: {len(result.paired)} shared samples paired"))
    tokens, wall = result.tokens, result.wall_seconds
    lines.append(
        Text(
            f"tokens: A {tokens['a']:,} · B {tokens['b']:,} · B - A {tokens['difference']:+,} "
            f"({_signed(tokens['per_sample'])} per sample); sample time: A {wall['a']:.1f}s · B {wall['b']:.1f}s · "
            f"B - A {wall['difference']:+.1f}s"
        )
    )
    return Group(*lines)


def _signed(value: object) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _divergence(divergence: Any) -> str:
    if not divergence:
        return ""
    changed = ", ".join(sorted(divergence.get("diff") or {})) or "the request"
    return f"diverged at step {divergence.get('step')} ({changed})"


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.3f}"


def _value(entry: Any) -> str:
    if entry is None:
        return "-"
    if entry.get("error"):
        return "error"
    return str(entry.get("value"))


def _clip(value: object, limit: int = 40) -> str:
    text = "" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
