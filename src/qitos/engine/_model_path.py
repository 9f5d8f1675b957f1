"""The DECIDE phase when ``decide`` returns None: exchange log -> RequestView -> model -> Decision.

Each model turn is one exchange of the run's ExchangeLog: its inputs (the task on the first turn,
steering, environment observations, repair feedback), the model's output, and the results of its
tool calls. The request sent is ``RequestView.from_exchange_log`` under the model's declared budget.
The log redacts what it records (token shapes and the model's configured credentials, see
``qitos.core._redaction``), so the model is sent, and a session stores, the redacted text.

A reply that cannot be used (malformed tool calls, unparseable text, empty, cut off) never becomes
a final answer: the step becomes ``Decision.wait`` and the repair feedback is recorded in the log,
once, so the model sees what went wrong on its next turn: as the result of the reply's first tool
call (its other calls point there), or, for a reply without tool calls, as the next exchange's input.

A typed final answer (the agent's ``output_type``; see ``qitos.core._output``): the request offers
the ``final_answer`` tool (with a text protocol: an instruction giving the schema) and asks for
``structured_output``; a ``final_answer`` call, or a text reply holding the JSON object, is
validated, and one that does not validate is repaired like any unusable reply. A valid answer is
``Decision.final`` with the JSON text as the answer and the data as ``meta["output"]``.

Per request, :class:`ModelContext` sets the tool use (``tool_use_policy``: a policy name or a
function of the :class:`~qitos.core.context.ContextRequest`; the view's ``tool_use_satisfied`` is
whether a tool result is already in the log, so ``"required"`` means "until a tool was used") and
the reasoning effort (``reasoning_policy``).

Each call is bracketed by a ``model_request`` event (request id, provider, model) and a
``model_response`` event (model, finish reason, usage, tool-call count; ``ok=False`` with the error
when the call raised), which telemetry times its ``chat`` spans by. The prompt and the reply are
added to them only when a hook asks for content (``EngineHook.wants_model_content``).

The model call itself is an effect (``ModelCall``) that the loop's driver performs: ``complete`` in
the calling thread, or an awaited ``acomplete`` on the event loop.

With a trace, the messages of every request are stored once in the run's ``messages.jsonl``: the
step's model entry and both events refer to them (``message_refs``: runs of line positions). A
failed ``model_response`` also carries the ``status_code``, the ``error_type`` and the request
view summary, so the request inspector shows a request that never got an answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from qitos.core._decision import Decision, Observation
from qitos.core._exchange import CATEGORY_BITS, ExchangeLog
from qitos.core._output import FINAL_ANSWER_TOOL, STRUCTURED_OUTPUT, OutputSpec, OutputValidationError
from qitos.core._redaction import Redactor, model_credentials
from qitos.core._tool import ToolResult
from qitos.core.context import ContextRequest, DeclaredContextBudgetPolicy
from qitos.core.request_view import ReasoningPolicy, RequestView
from qitos.engine._agent_context import request_compaction, request_contributors
from qitos.engine._effects import Loop, ModelCall
from qitos.engine._events import EngineEvent, EngineEventType, RuntimePhase
from qitos.engine._run_context import RunContext
from qitos.kit.parsers._base import ParseError
from qitos.kit.parsers._native import NATIVE_PROTOCOL_ID, decision_from_tool_calls
from qitos.models._base import ModelResponse, request_digest

__all__ = ["ModelContext", "ModelOutcome", "ModelPath", "record_results"]


@dataclass
class ModelContext:
    """How the engine builds model requests.

    Args:
        contributors: context contributors consulted on every request, in order.
        compaction_policy: the compactor allowed to omit old closed exchanges (None: never omit).
        budget_policy: turns the adapter's declared capacity into a ContextBudget.
        selection_policy: orders and selects contributions (default: priority).
        unit_counter: counts units (default: characters, or as the budget's unit requires).
        tool_use_policy: the tool use of each request (``auto``, ``required``, ``none`` or a tool's
            name), or a function ``ContextRequest -> str`` deciding it per request. ``required``
            and a tool's name are satisfied once a tool result is in the log (then ``auto``).
        reasoning_policy: the reasoning effort (and replay mode) of every request.
    """

    contributors: Sequence[Any] = ()
    compaction_policy: Any = None
    budget_policy: DeclaredContextBudgetPolicy = field(default_factory=DeclaredContextBudgetPolicy)
    selection_policy: Any = None
    unit_counter: Any = None
    tool_use_policy: str | Callable[[ContextRequest], str] = "auto"
    reasoning_policy: ReasoningPolicy | None = None


@dataclass
class ModelOutcome:
    """What one model-path DECIDE produced."""

    decision: Decision[Any]
    view: RequestView
    model_entry: dict[str, Any]
    view_summary: dict[str, Any]
    log_entries: list[dict[str, Any]]
    tokens: int


class ModelPath:
    """Runs the model path of one engine's runs (created on the first model step).

    Args:
        agent: the agent (its system prompt, ``prepare`` and tool registry).
        model: the model adapter.
        parser: a text protocol parser, or None for native tool calls.
        context: how requests are built (None: the defaults of ``ModelContext``).
        content_events: put the prompt and the reply in the model_request/model_response events.
        history_policy: the engine's ``history_policy`` (a compaction policy), used when the context
            names none; the agent's ``memory`` is recalled after the context's contributors (see
            ``qitos.engine._agent_context``).

    It keeps no per-run state: everything a run needs is in its ``RunContext``, so one ModelPath
    serves any number of runs at once.
    """

    def __init__(
        self,
        agent: Any,
        model: Any,
        parser: Any,
        context: ModelContext | None = None,
        *,
        content_events: bool = False,
        history_policy: Any = None,
    ) -> None:
        self.agent = agent
        self.model = model
        self.parser = parser
        self.context: ModelContext = context if context is not None else ModelContext()
        self.content_events = content_events
        self.contributors = request_contributors(agent, self.context.contributors)
        self.compaction_policy = request_compaction(self.context.compaction_policy, history_policy)

    def decide(self, run: RunContext, step_id: int) -> Loop[ModelOutcome]:
        """Build the request, ask for the model call (an effect), record the reply, parse it."""
        agent, model = self.agent, self.model
        if run.log is None:
            run.log = ExchangeLog(f"log-{run.run_id}")
        log: ExchangeLog = run.log
        if log.redactor is None:  # what the model is sent and a session stores passes the policy
            log.redactor = Redactor(model_credentials(model))
        start = log.position
        exchange_id = self._open_exchange(run, log)
        state = run.state
        registry = agent.tool_registry
        parser = self.parser
        instructions = []
        system_prompt = agent.build_system_prompt(state)
        if system_prompt:
            instructions.append({"role": "system", "content": system_prompt})
        if parser is not None and hasattr(parser, "instructions"):
            instructions.append({"role": "system", "content": parser.instructions(registry.schemas())})
        native_tools = parser is None
        spec = _output_spec(agent)
        tool_schemas: list[dict[str, Any]] = registry.schemas() if native_tools else []
        if spec is not None:
            if native_tools:
                tool_schemas = [*tool_schemas, spec.tool_schema()]  # the registry's list stays as it is
            else:
                instructions.append({"role": "system", "content": _output_instruction(spec)})
        contributions = []
        request = ContextRequest(step_id=step_id, task=state.task, log=log, state=state)
        for contributor in self.contributors:
            contributions.extend(contributor.contribute(request))
        budget = self.context.budget_policy.budget_for(
            getattr(model, "max_input_units", None), getattr(model, "unit", None)
        )
        tool_use = self.context.tool_use_policy
        view = RequestView.from_exchange_log(
            log,
            model=model,
            instructions=instructions,
            tool_schemas=tool_schemas,
            capability_requirements=(STRUCTURED_OUTPUT,) if spec is not None and native_tools else (),
            context_budget=budget,
            context_contributions=contributions,
            context_selection_policy=self.context.selection_policy,
            context_unit_counter=self.context.unit_counter,
            compaction_policy=self.compaction_policy,
            protocol_id=NATIVE_PROTOCOL_ID if native_tools else getattr(parser, "protocol_id", type(parser).__name__),
            tool_use_policy=tool_use(request) if callable(tool_use) else tool_use,
            tool_use_satisfied=bool(log.projection().category_or[-1] & CATEGORY_BITS["tool_results"]),
            reasoning_policy=self.context.reasoning_policy,
        )
        messages = run.writer.request_messages(view) if run.writer is not None else None
        for receipt in view.compaction_receipts:
            run.emit(
                EngineEvent(EngineEventType.COMPACTION, step_id, phase=RuntimePhase.DECIDE, payload=receipt.to_dict())
            )
        on_delta = None
        if run.live:

            def on_delta(text: str) -> None:
                run.emit(
                    EngineEvent(EngineEventType.MODEL_DELTA, step_id, phase=RuntimePhase.DECIDE, payload={"text": text})
                )

        def on_adapter_event(kind: str, payload: dict[str, Any]) -> None:
            if kind == "model_retry":
                run.emit(
                    EngineEvent(
                        EngineEventType.MODEL_RETRY, step_id, phase=RuntimePhase.DECIDE, ok=False, payload=payload
                    )
                )

        response = yield from self._call_model(run, model, view, step_id, on_delta, on_adapter_event, messages)
        log.record_output(exchange_id, response.message())
        decision = self._parse(log, exchange_id, response, parser, registry.names(), spec)
        model_entry: dict[str, Any] = {
            "request_id": view.request_id,
            "request_digest": request_digest(view),
            "response": response.to_dict(),
        }
        if messages is not None:
            model_entry["message_refs"] = messages
        return ModelOutcome(
            decision=decision,
            view=view,
            model_entry=model_entry,
            view_summary=view.summary(compact=True),
            log_entries=log.entries(start),
            tokens=response.usage.total_tokens,
        )

    # ------------------------------------------------------------------ internals

    def _call_model(
        self,
        run: RunContext,
        model: Any,
        view: RequestView,
        step_id: int,
        on_delta: Any,
        listener: Any,
        message_refs: list[list[int]] | None,
    ) -> Loop[ModelResponse]:
        # model_request / model_response bracket the call (telemetry times its span by them); the
        # prompt and the reply are in them only when a hook asked for content (``content_events``).
        content = self.content_events
        target = view.target
        request: dict[str, Any] = {"request_id": view.request_id, "provider": target.provider, "model": target.model}
        if message_refs is not None:
            request["message_refs"] = message_refs
        if content:
            request["messages"] = view.messages()
        run.emit(EngineEvent(EngineEventType.MODEL_REQUEST, step_id, phase=RuntimePhase.DECIDE, payload=request))
        try:
            response: ModelResponse = yield ModelCall(model, view, on_delta=on_delta, listener=listener)
        except BaseException as exc:
            failed: dict[str, Any] = {
                "request_id": view.request_id,
                "request_digest": request_digest(view),
                "status_code": getattr(exc, "status_code", None),
                "error_type": type(exc).__name__,
                "request_view": view.summary(compact=True),
            }
            if message_refs is not None:
                failed["message_refs"] = message_refs
            run.emit(
                EngineEvent(
                    EngineEventType.MODEL_RESPONSE,
                    step_id,
                    phase=RuntimePhase.DECIDE,
                    ok=False,
                    payload=failed,
                    error=f"{type(exc).__name__}: {exc}",
                )
            )
            raise
        reply: dict[str, Any] = {
            "request_id": view.request_id,
            "model": response.model,
            "finish_reason": response.finish_reason,
            "usage": response.usage.to_dict(),
            "tool_calls": len(response.tool_calls),
        }
        if content:
            reply["message"] = response.message()
        run.emit(EngineEvent(EngineEventType.MODEL_RESPONSE, step_id, phase=RuntimePhase.DECIDE, payload=reply))
        return response

    def _open_exchange(self, run: RunContext, log: ExchangeLog) -> str:
        inputs: list[dict[str, Any]] = []
        if not log.exchange_count:
            inputs.append({"role": "user", "content": self.agent.prepare(run.state)})
        inputs.extend({"role": "user", "content": text} for text in run.steering)
        observation = run.observation
        if isinstance(observation, Observation) and observation.env is not None and log.exchange_count:
            inputs.append({"role": "user", "content": f"Environment observation: {observation.env}"})
        current = log.open_exchange
        if current is not None:
            if current.output is None and not inputs:
                return current.exchange_id  # inputs recorded earlier (repair feedback, observations)
            # A step that never finished (cancelled midway): its calls get an explicit result first,
            # so the exchange can close and no tool result is ever sent without its call.
            for call_id in current.pending_tool_call_ids:
                log.record_tool_result(
                    current.exchange_id, call_id, "ERROR (interrupted): the step stopped before this call ran"
                )
            log.close(current.exchange_id)
        return log.open(inputs).exchange_id

    def _parse(
        self,
        log: ExchangeLog,
        exchange_id: str,
        response: ModelResponse,
        parser: Any,
        tool_names: list[str],
        spec: OutputSpec | None,
    ) -> Decision[Any]:
        try:
            if response.tool_calls or parser is None:
                names = tool_names if spec is None else [*tool_names, FINAL_ANSWER_TOOL]
                decision = decision_from_tool_calls(response, tool_names=names)
            else:
                decision = parser.parse(response.text or "", tool_names=tool_names)
            if spec is not None:
                decision = _typed_answer(log, exchange_id, decision, spec)
        except ParseError as exc:
            # The model reads the feedback once: in the answer to its first call (every declared call
            # needs a result before the exchange can close), or, for a reply without calls, as the
            # next exchange's input.
            calls = response.tool_calls
            for call in calls:
                text = exc.feedback if call is calls[0] else f"see the result of call {calls[0].id}"
                log.record_tool_result(exchange_id, call.id, f"ERROR (not run): {text}")
            log.close(exchange_id)
            if not calls:
                log.open([{"role": "user", "content": exc.feedback}])
            return Decision.wait(
                rationale=f"the model's reply could not be used: {exc}",
                meta={"parse_error": str(exc), "feedback": exc.feedback},
            )
        if decision.mode != "act":
            log.close(exchange_id)
        return decision


def record_results(log: ExchangeLog, results: Sequence[ToolResult]) -> None:
    """Record a model step's tool results in its exchange and close it.

    A module function, not a :class:`ModelPath` method: a step resumed after a crash finishes the
    model's decision it restored, on an engine that has made no model call yet.
    """
    exchange = log.open_exchange
    if exchange is None or exchange.output is None:
        return  # this step's decision did not come from the model
    declared = {call.id for call in exchange.tool_calls}
    if declared:
        for result in results:
            if result.call_id in declared:
                log.record_tool_result(exchange.exchange_id, result.call_id, result.as_text())
        log.close(exchange.exchange_id)
        return
    # A text protocol: results go back to the model as the next exchange's input.
    log.close(exchange.exchange_id)
    text = "\n".join(f"Observation from {r.name} ({r.call_id}): {r.as_text()}" for r in results)
    log.open([{"role": "user", "content": text}])


def _output_spec(agent: Any) -> OutputSpec | None:
    output_type = getattr(agent, "output_type", None)
    if output_type is None:
        return None
    spec = OutputSpec.of(output_type)
    spec.check_tools(agent.tool_registry.names(), type(agent).__name__)
    return spec


def _output_instruction(spec: OutputSpec) -> str:
    schema = json.dumps(spec.schema, ensure_ascii=False, sort_keys=True)
    return f"Your final answer must be a {spec.name} object: reply with only JSON matching this schema: {schema}"


def _typed_answer(log: ExchangeLog, exchange_id: str, decision: Decision[Any], spec: OutputSpec) -> Decision[Any]:
    """The decision with its final answer validated against the output type: a valid
    ``final_answer`` call or JSON reply becomes ``Decision.final``; ParseError with repair feedback
    when it does not validate (or the call came with others)."""
    if decision.mode == "act":
        finals = [a for a in decision.actions if a.name == FINAL_ANSWER_TOOL]
        if not finals:
            return decision
        raw = json.dumps([a.to_dict() for a in decision.actions], ensure_ascii=False, default=repr)
        if len(decision.actions) > 1:
            raise ParseError(
                f"{FINAL_ANSWER_TOOL} called together with other tools",
                feedback=(
                    f"None of these calls ran: call {FINAL_ANSWER_TOOL} alone, in a reply of its own, once the "
                    "other tools have answered."
                ),
                raw=raw,
            )
        action = finals[0]
        try:
            value = spec.validate(dict(action.args))
        except OutputValidationError as exc:
            raise ParseError(f"invalid {spec.name}: {exc}", feedback=spec.feedback(exc.problems), raw=raw) from exc
        log.record_tool_result(exchange_id, action.id, f"accepted as the final {spec.name}")
    elif decision.mode == "final":
        text = decision.final_answer or ""
        try:
            value = spec.parse(text)
        except OutputValidationError as exc:
            raise ParseError(f"invalid {spec.name}: {exc}", feedback=spec.feedback(exc.problems), raw=text) from exc
    else:
        return decision
    data = spec.to_data(value)
    return Decision.final(json.dumps(data, ensure_ascii=False), rationale=decision.rationale, meta={"output": data})
