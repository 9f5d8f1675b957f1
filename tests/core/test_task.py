"""Task, TaskBudget and TaskResource: fields, validation, resource checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qitos import Task, TaskBudget, TaskResource
from qitos.core._task import EnvSpec, TaskValidationError


def test_task_example_from_the_seed_builds() -> None:
    task = Task(
        id="research-001",
        objective="Summarize the findings in paper.pdf",
        resources=[
            TaskResource(kind="file", path="paper.pdf", required=True),
        ],
        budget=TaskBudget(max_steps=25, max_runtime_seconds=300.0),
        success_criteria=["Summary covers abstract, methods, and conclusions"],
        constraints={"output_format": "markdown"},
    )
    assert task.id == "research-001"
    assert task.budget.max_steps == 25 and task.budget.max_tokens is None
    assert task.resources[0].path == "paper.pdf"


def test_task_has_the_seed_fields() -> None:
    names = {f.name for f in dataclasses.fields(Task)}
    assert names == {
        "id",
        "objective",
        "resources",
        "env_spec",
        "constraints",
        "success_criteria",
        "budget",
        "inputs",
        "metadata",
    }


def test_task_budget_example_from_the_seed_and_none_defaults() -> None:
    budget = TaskBudget(max_steps=30, max_runtime_seconds=180.0, max_tokens=100_000)
    assert (budget.max_steps, budget.max_runtime_seconds, budget.max_tokens) == (30, 180.0, 100_000)
    empty = TaskBudget()
    assert (empty.max_steps, empty.max_runtime_seconds, empty.max_tokens) == (None, None, None)


@pytest.mark.parametrize(
    ("field", "value"), [("max_steps", 0), ("max_steps", -3), ("max_runtime_seconds", -1.0), ("max_tokens", True)]
)
def test_task_budget_rejects_non_positive_limits_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(TaskValidationError, match=f"TaskBudget.{field}"):
        TaskBudget(**{field: value})  # type: ignore[arg-type]


def test_resource_examples_from_the_seed_build() -> None:
    file = TaskResource(kind="file", path="data/corpus.txt", required=True)
    optional_dir = TaskResource(kind="dir", path="output/", required=False)
    url = TaskResource(kind="url", uri="https://arxiv.org/abs/2501.12345", required=True)
    artifact = TaskResource(kind="artifact", path="runs/agent_20260407/steps.jsonl")
    assert [r.kind for r in (file, optional_dir, url, artifact)] == ["file", "dir", "url", "artifact"]
    assert artifact.required is True
    assert url.location == "https://arxiv.org/abs/2501.12345"


def test_a_bad_resource_kind_is_rejected_listing_the_valid_kinds() -> None:
    with pytest.raises(TaskValidationError) as info:
        TaskResource(kind="database", path="x")  # type: ignore[arg-type]
    message = str(info.value)
    assert "'database'" in message
    for kind in ("file", "dir", "url", "artifact"):
        assert kind in message


def test_a_url_resource_needs_a_uri_and_a_file_needs_a_path() -> None:
    with pytest.raises(TaskValidationError, match="uri"):
        TaskResource(kind="url", path="https://example.org")
    with pytest.raises(TaskValidationError, match="path"):
        TaskResource(kind="file", uri="file:///x")


def test_missing_required_files_and_dirs_are_reported_by_name(tmp_path: Path) -> None:
    (tmp_path / "present.txt").write_text("x")
    (tmp_path / "present_dir").mkdir()
    task = Task(
        objective="o",
        resources=[
            TaskResource(kind="file", path="present.txt"),
            TaskResource(kind="dir", path="present_dir"),
            TaskResource(kind="file", path="absent.txt"),
            TaskResource(kind="dir", path="absent_dir"),
            TaskResource(kind="file", path="optional.txt", required=False),
        ],
    )
    problems = task.missing_resources(str(tmp_path))
    assert len(problems) == 2
    assert "absent.txt" in problems[0] and "absent_dir" in problems[1]


def test_a_directory_does_not_satisfy_a_file_resource(tmp_path: Path) -> None:
    (tmp_path / "thing").mkdir()
    assert TaskResource(kind="file", path="thing").problem(str(tmp_path)) is not None


@pytest.mark.parametrize("uri", ["https://example.org/a?b=1", "s3://bucket/key", "http://localhost:8080"])
def test_well_formed_urls_pass_without_network(uri: str) -> None:
    assert TaskResource(kind="url", uri=uri).problem() is None


@pytest.mark.parametrize("uri", ["not a url", "example.org/path", "https:///nohost", "http://has space.org"])
def test_malformed_urls_are_reported(uri: str) -> None:
    problem = TaskResource(kind="url", uri=uri).problem()
    assert problem is not None and uri in problem


def test_task_coerces_a_string_objective_and_rejects_other_types() -> None:
    task = Task.coerce("do it")
    assert task.objective == "do it" and task.id.startswith("task-")
    assert Task.coerce(task) is task
    with pytest.raises(TaskValidationError, match="str or a Task"):
        Task.coerce(42)  # type: ignore[arg-type]


def test_task_rejects_non_resource_items_and_a_non_budget() -> None:
    with pytest.raises(TaskValidationError, match="TaskResource"):
        Task(objective="o", resources=["paper.pdf"])  # type: ignore[list-item]
    with pytest.raises(TaskValidationError, match="TaskBudget"):
        Task(objective="o", budget={"max_steps": 3})  # type: ignore[arg-type]


def test_task_to_dict_and_from_dict_round_trip_resources_and_budget() -> None:
    task = Task(
        id="t-1",
        objective="o",
        resources=[
            TaskResource(kind="file", path="a.txt"),
            TaskResource(kind="url", uri="https://example.org", required=False),
        ],
        budget=TaskBudget(max_steps=3, max_tokens=10),
        success_criteria=["c"],
        constraints={"k": "v"},
        inputs={"n": 1},
        metadata={"m": True},
    )
    back = Task.from_dict(task.to_dict())
    assert back == dataclasses.replace(task, resources=tuple(task.resources), success_criteria=("c",))


def test_task_env_spec_round_trips_through_its_dict_form() -> None:
    task = Task(objective="o", env_spec=EnvSpec(kind="docker", capabilities=("shell", "fs"), config={"image": "py"}))
    assert Task.from_dict(task.to_dict()) == task


def test_older_task_records_with_only_a_resource_location_still_load() -> None:
    record = {
        "id": "t-old",
        "objective": "o",
        "resources": [
            {"kind": "file", "location": "a.txt", "required": True},
            {"kind": "url", "location": "https://example.org", "required": False},
        ],
    }
    back = Task.from_dict(record)
    assert back.resources == (
        TaskResource(kind="file", path="a.txt"),
        TaskResource(kind="url", uri="https://example.org", required=False),
    )


def test_task_ids_are_unique_by_default() -> None:
    assert len({Task(objective="o").id for _ in range(50)}) == 50


def test_a_task_whose_text_cannot_be_encoded_is_refused_naming_the_field() -> None:
    from qitos.core._errors import CodecError

    with pytest.raises(CodecError, match="lone surrogate") as caught:
        Task.coerce("summarise \ud800 this")
    assert caught.value.path == "Task.objective"
    with pytest.raises(CodecError) as caught:
        Task(objective="ok", inputs={"files": ["a.md", "b\udc80.md"]})
    assert caught.value.path == "Task.inputs['files'][1]"
