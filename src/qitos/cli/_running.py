"""Running agents from the CLI: ``qitos demo`` and ``qitos run`` (and the helpers ``sessions resume`` uses).

The commands only wire library parts together (an Engine or a ``compose()`` session, a model
adapter, the live renderer as an engine hook, a trace directory); the loop is the engine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from qitos.checkpoint._targets import open_store, sqlite_path
from qitos.cli._agents import AGENT_FORMS, load_agent
from qitos.cli._common import (
    DEFAULT_DB,
    DEFAULT_LOGDIR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    cli_command,
    console,
    fail,
    print_json,
    shown_command,
    store_target,
)
from qitos.cli._models import DEFAULT_OPENAI_WINDOW, MODEL_FORMS, RequestOptions, load_local_model, resolve_model
from qitos.cli._render import LiveRenderer
from qitos.core._agent_module import AgentModule
from qitos.core._redaction import Redactor
from qitos.core._task import Task, TaskBudget
from qitos.core.request_view import TOOL_USE_POLICIES
from qitos.engine._composition import compose
from qitos.engine._engine import Engine
from qitos.engine._events import EngineResult
from qitos.engine._model_path import ModelContext
from qitos.engine._otlp import otlp_export
from qitos.engine.session_runtime import new_session
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.viewer._data import CLI_OPTIONS

__all__ = [
    "DEMO_DEFAULT_MODEL",
    "DEMO_DEFAULT_POLICY",
    "DEMO_SCRIPTED_CAPACITY",
    "DEMO_TASK",
    "demo",
    "exit_code_for_result",
    "failure_hint",
    "finish",
    "outcome",
    "require_model",
    "run",
]

# The demo's defaults: the embedded local model deciding through the engine's model path.
# `--policy scripted` runs the deterministic decide policy instead (no model at all).
DEMO_DEFAULT_POLICY = "model"
DEMO_DEFAULT_MODEL = "local"
DEMO_TASK = "Index the notes in this workspace: list them, read each one, and write INDEX.md."
# The scripted demo model declares a small context window so that late requests need compaction
# (and the viewer has receipts to show).
DEMO_SCRIPTED_CAPACITY = 2400

_NORMAL_STOPS = frozenset({"paused", "awaiting_approval"})
_SHOWN = Redactor()
_COMPACTION = {"closed_window": ClosedExchangeWindowCompactor}


def outcome(result: EngineResult[Any], **extra: object) -> dict[str, Any]:
    """The JSON shape of a finished run (``--json`` of demo, run and sessions resume), redacted
    like everything qitos shows (``qitos.core._redaction``).

    ``steps`` and ``tokens`` are this run's own (its committed step records); ``session_steps`` is
    where the state is now, which for a resumed session run also counts the earlier runs' steps.
    """
    task_result = result.task_result
    data: dict[str, Any] = {
        "run_id": result.run_id,
        "session_id": None,
        "status": task_result.status if task_result else None,
        "stop_reason": result.state.stop_reason,
        "steps": len(result.records),
        "session_steps": result.step_count,
        "final_result": result.state.final_result,
        "tokens": sum(_record_tokens(record) for record in result.records),
        "run_dir": result.run_dir,
        "error": task_result.error if task_result else None,
    }
    data.update(extra)
    shown: dict[str, Any] = _SHOWN.redact_value(data)
    return shown


def _record_tokens(record: Any) -> int:
    usage = ((record.model or {}).get("response") or {}).get("usage") or {}
    return int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)


def exit_code_for_result(result: EngineResult[Any]) -> int:
    """0 when the run completed (or paused / awaits approval, as asked), else 1."""
    status = result.task_result.status if result.task_result else None
    if status == "completed" or result.state.stop_reason in _NORMAL_STOPS:
        return EXIT_OK
    return EXIT_FAILED


def renderer_hooks(json_out: bool, *, max_tokens: int | None = None) -> tuple[list[Any], LiveRenderer | None]:
    """The live renderer as an engine hook (none with ``--json``: stdout is for the JSON only)."""
    if json_out:
        return [], None
    renderer = LiveRenderer(console(), max_tokens=max_tokens)
    return [renderer], renderer


def require_model(agent: AgentModule[Any, Any, Any], adapter: object, *, what: str) -> None:
    """Stop before anything runs when the agent decides through a model and none was given.

    An agent that does not override ``decide`` (and brings no model of its own) asks its model at
    every step; running it without ``--model`` could only fail, and a stored session would be
    marked failed for a missing command-line option. ``what`` names the command for the message.
    """
    if adapter is not None:
        return
    if type(agent).decide is AgentModule.decide and agent.llm is None:
        fail(
            f"{type(agent).__name__} decides through a model (it does not override decide), and {what} was "
            f"given none: pass --model ({MODEL_FORMS})",
            EXIT_USAGE,
        )


def failure_hint(result: EngineResult[Any], model: object) -> str | None:
    """A hint for a failed run whose cause is a common set-up mistake (a base URL without /v1)."""
    error = (result.task_result.error if result.task_result else None) or ""
    base_url = getattr(model, "base_url", None)
    if "HTTP 404" in error and isinstance(base_url, str) and not base_url.rstrip("/").endswith("/v1"):
        return (
            f"the server answered 404 for {base_url}/chat/completions; OpenAI-compatible servers usually serve "
            f"the API under /v1: try --base-url {base_url.rstrip('/')}/v1"
        )
    return None


def finish(
    result: EngineResult[Any],
    json_out: bool,
    renderer: LiveRenderer | None,
    *,
    adapter: object = None,
    db: str = DEFAULT_DB,
    trace_dir: str = DEFAULT_LOGDIR,
    **extra: object,
) -> None:
    """Print the outcome (JSON, or the commands that show the session and the trace, with the
    ``--db`` and ``--logdir`` this run used) and exit with the run's code."""
    if renderer is not None:
        renderer.close()
    data = outcome(result, **extra)
    hint = failure_hint(result, adapter)
    if hint:
        data["hint"] = hint
    if json_out:
        print_json(data)
    else:
        out = console()
        if hint:
            console(stderr=True).print(f"hint: {hint}", soft_wrap=True)
        if data.get("session_id"):
            show = shown_command("qitos", "sessions", "show", data["session_id"], db=None if db == DEFAULT_DB else db)
            out.print(f"session: {data['session_id']}  ({show})", soft_wrap=True)
        if data.get("run_dir"):
            logdir = None if trace_dir == DEFAULT_LOGDIR else trace_dir
            show = shown_command("qitos", "trace", "show", data["run_id"], logdir=logdir)
            out.print(f"trace: {data['run_dir']}  ({show})", soft_wrap=True)
    raise typer.Exit(exit_code_for_result(result))


# --------------------------------------------------------------------------- qitos demo


@cli_command
def demo(
    policy: Annotated[
        str | None,
        typer.Option(help="scripted: a deterministic decide policy; model: the engine's model path."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="With --policy model: local (the embedded model) or scripted (a fixed script)."),
    ] = None,
    workspace: Annotated[
        Path | None,
        typer.Option(
            help="Notes directory. Missing or empty: the bundled notes are copied there. Default: a temp dir."
        ),
    ] = None,
    trace_dir: Annotated[str, typer.Option(help="Where run traces are written.")] = DEFAULT_LOGDIR,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit.")] = None,
    db: Annotated[
        str, typer.Option("--db", help="Session store (SQLite file or postgresql:// URL).", callback=store_target)
    ] = DEFAULT_DB,
    json_out: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON (no live output).")] = False,
    otel: Annotated[
        bool, typer.Option("--otel", help="Export OpenTelemetry spans over OTLP/HTTP (set by OTEL_EXPORTER_OTLP_*).")
    ] = False,
) -> None:
    """Run the demo agent end to end, offline, as a durable session: it lists, reads and indexes a few notes.

    Defaults: the embedded local model and a local SQLite session store (``--db``).
    """
    from qitos.demo._notes_agent import NotesAgent, prepare_workspace, scripted_model_responses

    chosen = policy or ("model" if model else DEMO_DEFAULT_POLICY)
    if chosen not in ("scripted", "model"):
        fail(f"--policy must be scripted or model, got {chosen!r}", EXIT_USAGE)
    if chosen == "scripted" and model:
        fail("--model applies to --policy model (the scripted policy uses no model)", EXIT_USAGE)
    model_spec = (model or DEMO_DEFAULT_MODEL) if chosen == "model" else None
    if model_spec not in (None, "local", "scripted"):
        fail(f"qitos demo --model takes local or scripted, got {model_spec!r}", EXIT_USAGE)
    root, copied = prepare_workspace(workspace)
    adapter: Any = None
    if model_spec == "scripted":
        from qitos.models._scripted import ScriptedModel

        adapter = ScriptedModel(scripted_model_responses(root), max_input_units=DEMO_SCRIPTED_CAPACITY)
    elif model_spec == "local":
        adapter = load_local_model()
    hooks, renderer = renderer_hooks(json_out)
    if not json_out:
        origin = "bundled notes copied" if copied else "existing notes"
        what = f"policy {chosen}" + (f", model {model_spec}" if model_spec else "")
        console().print(f"workspace: {root} ({origin}); {what}", highlight=False)
    _make_parent(db)
    with otlp_export(otel) as provider:
        composition = compose(
            agent=lambda: NotesAgent(root, policy=chosen),  # type: ignore[arg-type]
            checkpoint_store=open_store(db),
            model=adapter,
            hooks=hooks,
            trace_logdir=trace_dir,
            otel=provider,
            **compaction_extensions(True),
        )
        session = composition.session(Task(objective=DEMO_TASK, budget=TaskBudget(max_steps=max_steps)))
        result = session.run()
    finish(
        result,
        json_out,
        renderer,
        db=db,
        trace_dir=trace_dir,
        session_id=session.session_id.value,
        workspace=str(root),
        policy=chosen,
        model=model_spec,
    )


# --------------------------------------------------------------------------- qitos run


def _make_parent(db: str) -> None:
    """Create the directory a SQLite store's file goes in (a PostgreSQL URL needs none)."""
    path = sqlite_path(db)
    if path is not None:
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)


def compaction_extensions(compact: bool) -> dict[str, Any]:
    """``compose`` keyword arguments for the optional closed-window compaction."""
    if not compact:
        return {}
    return {"extensions": dict(_COMPACTION), "compaction": {"provider": "closed_window"}}


@cli_command
def run(
    agent: Annotated[str, typer.Argument(help=f"The agent: {AGENT_FORMS}.")],
    task: Annotated[str, typer.Argument(help="The task objective.")],
    model: Annotated[str | None, typer.Option(help=f"Model: {MODEL_FORMS}.")] = None,
    base_url: Annotated[str | None, typer.Option(help="API root for --model openai:NAME (ends in /v1).")] = None,
    max_input_units: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Declared context window of the model, in its unit (openai:NAME default: {DEFAULT_OPENAI_WINDOW:,} "
            "tokens, a conservative guess; set the server's real window).",
        ),
    ] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, help="Sampling temperature (openai:NAME).")] = None,
    max_output_tokens: Annotated[
        int | None, typer.Option(min=1, help="Output token limit of each model reply (openai:NAME max_tokens).")
    ] = None,
    tool_choice: Annotated[
        str,
        typer.Option(
            help="Tool use of the model's requests: auto, none, required or a tool's name. required and a "
            "tool's name hold until a tool was used, then auto (so the agent can still finish).",
        ),
    ] = "auto",
    request_timeout: Annotated[
        float | None, typer.Option(min=0.001, help="Seconds one model request may take (openai:NAME; default 60).")
    ] = None,
    no_stream: Annotated[
        bool,
        typer.Option(
            "--no-stream",
            help="Never stream replies (openai:NAME), for a server that cannot stream (with tools). "
            "Without it, a server that refuses is asked again without streaming.",
        ),
    ] = False,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit (the task budget).")] = None,
    max_run_tokens: Annotated[
        int | None, typer.Option(min=1, help="Token budget of the whole run (all model requests together).")
    ] = None,
    trace_dir: Annotated[str, typer.Option(help="Where run traces are written.")] = DEFAULT_LOGDIR,
    session_db: Annotated[
        str | None,
        typer.Option(
            help="Run as a durable session in this store: SQLite file or postgresql:// URL.", callback=store_target
        ),
    ] = None,
    compact: Annotated[
        bool, typer.Option(help="Let old closed exchanges be omitted (with receipts) when the context is full.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON (no live output).")] = False,
    otel: Annotated[
        bool, typer.Option("--otel", help="Export OpenTelemetry spans over OTLP/HTTP (set by OTEL_EXPORTER_OTLP_*).")
    ] = False,
) -> None:
    """Run an agent on a task (API key from $QITOS_API_KEY or $OPENAI_API_KEY)."""
    factory = load_agent(agent)
    instance = factory()
    adapter = resolve_model(
        model,
        base_url=base_url,
        max_input_units=max_input_units,
        request=RequestOptions(
            temperature=temperature,
            max_output_tokens=max_output_tokens,
            timeout=request_timeout,
            stream=not no_stream,
        ),
    )
    require_model(instance, adapter, what="qitos run")
    if tool_choice not in TOOL_USE_POLICIES:
        names = instance.tool_registry.names()
        if tool_choice not in names:
            fail(
                f"--tool-choice {tool_choice!r} is not auto, none, required or one of the agent's tools "
                f"({', '.join(names) or 'it has none'})",
                EXIT_USAGE,
            )
    the_task = Task(objective=task, budget=TaskBudget(max_steps=max_steps, max_tokens=max_run_tokens))
    hooks, renderer = renderer_hooks(json_out, max_tokens=max_run_tokens)
    with otlp_export(otel) as provider:
        if session_db:
            _make_parent(session_db)
            store = open_store(session_db)
            composition = compose(
                agent=factory,
                checkpoint_store=store,
                model=adapter,
                hooks=hooks,
                trace_logdir=trace_dir,
                otel=provider,
                tool_use_policy=tool_choice,
                **compaction_extensions(compact),
            )
            # what `qitos sessions resume` needs again, so the commands it prints run as printed
            options = {"model": model, "base_url": base_url, "max_input_units": max_input_units, "compact": compact}
            metadata = {CLI_OPTIONS: {k: v for k, v in options.items() if v not in (None, False)}}
            session = new_session(composition.engine(), the_task, composition=composition, metadata=metadata)
            try:
                result = session.run()
            finally:
                store.close()
            finish(
                result,
                json_out,
                renderer,
                adapter=adapter,
                db=session_db,
                trace_dir=trace_dir,
                session_id=session.session_id.value,
            )
        context = ModelContext(
            compaction_policy=ClosedExchangeWindowCompactor() if compact else None, tool_use_policy=tool_choice
        )
        engine = Engine(instance, model=adapter, hooks=hooks, trace_logdir=trace_dir, context=context, otel=provider)
        finish(engine.run(the_task), json_out, renderer, adapter=adapter, trace_dir=trace_dir)
