"""Text decision protocols (ReAct, JSON) and native tool-call decisions: parse or explain, never guess."""

from __future__ import annotations

import pickle

import pytest

from qitos.core._errors import RunError
from qitos.kit.parsers._base import ParseError
from qitos.kit.parsers._json_protocol import JsonDecisionParser
from qitos.kit.parsers._native import decision_from_tool_calls
from qitos.kit.parsers._react import ReActParser
from qitos.models._base import ModelResponse, ToolCall

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "File path."}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    },
    {"name": "list_files", "description": "List files.", "parameters": {"type": "object", "properties": {}}},
]
NAMES = ["read_file", "list_files"]

# --------------------------------------------------------------------------- ReAct


def test_react_instructions_describe_the_format_and_every_tool() -> None:
    text = ReActParser().instructions(TOOLS)
    assert "Action: <tool name>[" in text and "Final Answer:" in text
    assert "- read_file: Read a file." in text and 'path: "string" - File path.' in text and 'limit?: "integer"' in text
    assert "- list_files: List files." in text and "(no arguments)" in text


def test_react_action_with_bracketed_json_arguments() -> None:
    decision = ReActParser().parse(
        'Thought: I should read the notes.\nAction: read_file[{"path": "notes/a.md"}]', tool_names=NAMES
    )
    assert decision.mode == "act"
    [action] = decision.actions
    assert (action.name, dict(action.args)) == ("read_file", {"path": "notes/a.md"})
    assert decision.rationale == "I should read the notes."


@pytest.mark.parametrize(
    "text",
    [
        "Action: list_files[]",
        "Action: list_files[{}]",
        "Action: list_files",
        "Thought: look\nAction: list_files\nAction Input: {}",
        "action: list_files( {} )",
    ],
)
def test_react_accepts_the_common_spellings_of_an_action_without_arguments(text: str) -> None:
    [action] = ReActParser().parse(text).actions
    assert (action.name, dict(action.args)) == ("list_files", {})


def test_react_action_input_form_and_several_parallel_actions() -> None:
    decision = ReActParser().parse(
        'Thought: both\nAction: read_file\nAction Input: {"path": "a"}\nAction: read_file[{"path": "b"}]'
    )
    assert [dict(a.args) for a in decision.actions] == [{"path": "a"}, {"path": "b"}]


def test_react_ignores_everything_from_an_invented_observation_on() -> None:
    decision = ReActParser().parse(
        'Action: read_file[{"path": "a"}]\nObservation: the file says hi\nThought: done\nFinal Answer: hi'
    )
    assert decision.mode == "act" and len(decision.actions) == 1


def test_react_final_answer_keeps_multiline_text() -> None:
    decision = ReActParser().parse("Thought: I know it.\nFinal Answer: Two files:\n- a.md\n- b.md")
    assert decision.mode == "final"
    assert decision.final_answer == "Two files:\n- a.md\n- b.md"
    assert decision.rationale == "I know it."


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("I think the answer is 42.", "neither an 'Action:' line nor a 'Final Answer:' line"),
        ('Action: read_file[{"path": "a"}]\nFinal Answer: done', "both an Action and a Final Answer"),
        ("Final Answer:   ", "Final Answer was empty"),
        ('Action: read_file[{"path": "a"]', "not valid JSON"),
        ('Action: read_file[["a"]]', "must be a JSON object"),
        ('Action: read_file[{"path": "a"} extra', "followed by ']'"),
        ("Action: [{}]", "did not start with a tool name"),
        ("Action: read_file path=a", "write its arguments as a JSON object"),
        ('Action: delete_everything[{"path": "/"}]', "no tool named 'delete_everything'"),
    ],
)
def test_react_malformed_replies_raise_parse_errors_with_repair_feedback(text: str, problem: str) -> None:
    with pytest.raises(ParseError) as info:
        ReActParser().parse(text, tool_names=NAMES)
    error = info.value
    assert problem in error.feedback
    assert "Final Answer:" in error.feedback or "Available tools" in error.feedback  # the expected format
    assert error.raw == text
    assert isinstance(error, RunError)


# --------------------------------------------------------------------------- JSON


def test_json_instructions_describe_both_forms_and_the_tools() -> None:
    text = JsonDecisionParser().instructions(TOOLS)
    assert '{"tool": "<tool name>", "arguments":' in text and '{"final": "<the answer>"}' in text
    assert "- read_file: Read a file." in text


def test_json_tool_call_final_answer_and_fenced_reply() -> None:
    parser = JsonDecisionParser()
    act = parser.parse('{"thought": "need it", "tool": "read_file", "arguments": {"path": "a"}}', tool_names=NAMES)
    assert act.mode == "act" and dict(act.actions[0].args) == {"path": "a"} and act.rationale == "need it"
    final = parser.parse('```json\n{"final": "It says hi."}\n```')
    assert (final.mode, final.final_answer) == ("final", "It says hi.")
    no_args = parser.parse('Sure: {"tool": "list_files"}')
    assert dict(no_args.actions[0].args) == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("   ", "empty"),
        ("The answer is 4.", "did not contain a JSON object"),
        ('{"tool": "read_file", "arguments": {"path": "a"}', "not valid JSON"),
        ('{"tool": "read_file", "final": "x"}', 'both "tool" and "final"'),
        ('{"thought": "hmm"}', 'neither "tool" nor "final"'),
        ('{"tool_name": "read_file"}', "unknown keys ['tool_name']"),
        ('{"final": ""}', '"final" must be a non-empty string'),
        ('{"final": 42}', '"final" must be a non-empty string, got 42'),
        ('{"tool": 7}', '"tool" must be the name of a tool'),
        ('{"tool": "read_file", "arguments": "a"}', '"arguments" must be a JSON object'),
        ('{"tool": "rm", "arguments": {}}', "no tool named 'rm'"),
    ],
)
def test_json_malformed_replies_raise_parse_errors_with_repair_feedback(text: str, problem: str) -> None:
    with pytest.raises(ParseError) as info:
        JsonDecisionParser().parse(text, tool_names=NAMES)
    assert problem in info.value.feedback
    assert '{"final"' in info.value.feedback or "Available tools" in info.value.feedback
    assert info.value.raw == text


# --------------------------------------------------------------------------- native tool calls


def call(name: str, raw: str, call_id: str = "c1") -> ToolCall:
    return ToolCall.from_raw(id=call_id, name=name, raw_arguments=raw)


def test_native_tool_calls_become_actions_with_the_providers_ids() -> None:
    response = ModelResponse(
        text="Reading both.",
        tool_calls=(call("read_file", '{"path": "a"}', "x1"), call("list_files", "", "x2")),
    )
    decision = decision_from_tool_calls(response, tool_names=NAMES)
    assert [(a.id, a.name, dict(a.args)) for a in decision.actions] == [
        ("x1", "read_file", {"path": "a"}),
        ("x2", "list_files", {}),
    ]
    assert decision.rationale == "Reading both."


def test_native_text_only_is_the_final_answer() -> None:
    decision = decision_from_tool_calls(ModelResponse(text="  All done.  ", finish_reason="stop"))
    assert (decision.mode, decision.final_answer) == ("final", "All done.")


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (ModelResponse(text=None), "empty"),
        (ModelResponse(text="   "), "empty"),
        (ModelResponse(text="The files are a.md and b", finish_reason="length"), "cut off"),
        (ModelResponse(tool_calls=(call("", "{}"),)), "has no tool name"),
        (ModelResponse(tool_calls=(call("read_file", '{"path": '),)), "invalid JSON"),
        (ModelResponse(tool_calls=(call("read_file", '["a"]'),)), "got a JSON list"),
        (ModelResponse(tool_calls=(call("format_disk", "{}"),)), "no tool named 'format_disk'"),
    ],
)
def test_native_unusable_replies_are_parse_errors_never_final_answers(response: ModelResponse, problem: str) -> None:
    with pytest.raises(ParseError) as info:
        decision_from_tool_calls(response, tool_names=NAMES)
    assert problem in info.value.feedback


def test_every_problem_of_several_calls_is_reported_at_once() -> None:
    response = ModelResponse(tool_calls=(call("nope", "{}", "a"), call("read_file", "{bad", "b")))
    with pytest.raises(ParseError) as info:
        decision_from_tool_calls(response, tool_names=NAMES)
    assert "tool call #1 ('nope')" in info.value.feedback and "tool call #2 ('read_file')" in info.value.feedback
    assert "nope({})" in info.value.raw and "read_file({bad)" in info.value.raw


def test_parse_errors_pickle_with_their_fields() -> None:
    error = ParseError("bad", feedback="fix it", raw="raw text")
    restored = pickle.loads(pickle.dumps(error))
    assert (str(restored), restored.feedback, restored.raw) == ("bad", "fix it", "raw text")
