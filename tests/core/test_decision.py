"""Decision and Action: the four validating factories and their JSON form."""

from __future__ import annotations

import pytest

from qitos import Action, Decision
from qitos.core._decision import DecisionError


def test_act_example_from_the_seed() -> None:
    decision: Decision[Action] = Decision.act(
        actions=[Action(name="read_file", args={"path": "paper.pdf"})],
        rationale="Need to read the file before summarizing.",
    )
    assert decision.mode == "act"
    assert decision.actions[0].name == "read_file" and decision.actions[0].args == {"path": "paper.pdf"}
    assert decision.rationale == "Need to read the file before summarizing."


def test_final_example_from_the_seed() -> None:
    decision: Decision[Action] = Decision.final(
        answer="The paper proposes a novel attention mechanism that reduces memory usage by 40%.",
        rationale="Finished reading all sections.",
    )
    assert decision.mode == "final"
    assert decision.final_answer is not None and decision.final_answer.startswith("The paper")
    assert decision.actions == ()


def test_wait_example_from_the_seed() -> None:
    decision: Decision[Action] = Decision.wait(rationale="Waiting for environment to reset.")
    assert decision.mode == "wait" and decision.actions == () and decision.final_answer is None


def test_branch_example_from_the_seed() -> None:
    decision: Decision[Action] = Decision.branch(
        candidates=[
            Decision.act([Action(name="search", args={"query": "attention mechanism"})]),
            Decision.act([Action(name="read_file", args={"path": "intro.txt"})]),
        ],
        rationale="Exploring two strategies in parallel.",
    )
    assert decision.mode == "branch"
    assert [c.actions[0].name for c in decision.candidates] == ["search", "read_file"]


def test_act_needs_at_least_one_action() -> None:
    with pytest.raises(DecisionError, match="at least one Action"):
        Decision.act([])


def test_act_rejects_things_that_are_not_actions() -> None:
    with pytest.raises(DecisionError, match="Action"):
        Decision.act([{"name": "read_file"}])  # type: ignore[list-item]


@pytest.mark.parametrize("answer", ["", "   ", None, 42])
def test_final_needs_a_non_empty_answer(answer: object) -> None:
    with pytest.raises(DecisionError, match="answer"):
        Decision.final(answer)  # type: ignore[arg-type]


def test_branch_needs_at_least_one_candidate_decision() -> None:
    with pytest.raises(DecisionError, match="at least one candidate"):
        Decision.branch([])
    with pytest.raises(DecisionError, match="Decision"):
        Decision.branch([Action(name="x")])  # type: ignore[arg-type]


def test_decision_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        Decision.act([])


def test_action_id_is_generated_when_absent_and_kept_when_given() -> None:
    a, b = Action(name="t"), Action(name="t")
    assert a.id and b.id and a.id != b.id
    assert Action("t", {"x": 1}, "call-7").id == "call-7"


def test_action_positional_form_is_name_args_id() -> None:
    action = Action("read", {"path": "p"}, "id1")
    assert (action.name, action.args, action.id) == ("read", {"path": "p"}, "id1")


def test_action_needs_a_name() -> None:
    with pytest.raises(DecisionError, match="name"):
        Action(name="")


def test_decisions_round_trip_through_their_dict_form() -> None:
    original: Decision[Action] = Decision.branch(
        [
            Decision.act([Action("a", {"n": 1}, "c1"), Action("b", {}, "c2")], "why", meta={"k": "v"}),
            Decision.final("done"),
            Decision.wait("later"),
        ],
        "choose",
    )
    assert Decision.from_dict(original.to_dict()) == original


def test_two_calls_with_one_id_in_a_decision_are_refused_naming_the_id() -> None:
    first = Action("append_note", {"text": "a"}, "call-1")
    second = Action("index_note", {}, "call-1")
    with pytest.raises(DecisionError, match=r"'call-1' is used by more than one call \(append_note, index_note\)"):
        Decision.act([first, second])
    with pytest.raises(DecisionError, match="call-1"):
        Decision("act", (first, second))
    assert len(Decision.act([first, Action("index_note", {}, "call-2")]).actions) == 2
