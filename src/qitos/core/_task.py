"""Tasks: ``Task``, ``TaskBudget``, ``TaskResource``, ``EnvSpec``, ``Env`` and ``TaskResult``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from qitos.core._codec import check_text
from qitos.core._errors import UsageError

__all__ = [
    "Env",
    "EnvSpec",
    "Task",
    "TaskBudget",
    "TaskResource",
    "TaskResult",
    "TaskValidationError",
]

ResourceKind = Literal["file", "dir", "url", "artifact"]
_RESOURCE_KINDS = ("file", "dir", "url", "artifact")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/?#]+[^\s]*$")


class TaskValidationError(UsageError, ValueError):
    """A Task or TaskResource is malformed (bad kind, missing path, negative budget)."""


@dataclass(frozen=True)
class TaskBudget:
    """Per-task limits; a field left None inherits the engine's RuntimeBudget."""

    max_steps: int | None = None
    max_runtime_seconds: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_runtime_seconds", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise TaskValidationError(f"TaskBudget.{name} must be > 0 or None, got {value!r}")


@dataclass(frozen=True)
class TaskResource:
    """A file, directory, URL or earlier run's artifact that a task depends on."""

    kind: ResourceKind
    path: str | None = None
    uri: str | None = None
    required: bool = True
    description: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _RESOURCE_KINDS:
            raise TaskValidationError(
                f"TaskResource.kind must be one of {', '.join(_RESOURCE_KINDS)}; got {self.kind!r}"
            )
        if self.kind == "url":
            if not self.uri:
                raise TaskValidationError("a url TaskResource needs uri=")
        elif not self.path:
            raise TaskValidationError(f"a {self.kind} TaskResource needs path=")

    @property
    def location(self) -> str:
        """The path or URI, for messages."""
        return str(self.uri) if self.kind == "url" else str(self.path)

    def problem(self, workspace: str | None = None) -> str | None:
        """Why this resource is unavailable, or None. URLs are checked for form only (no network)."""
        if self.kind == "url":
            return None if self.uri and _URL.match(self.uri) else f"url {self.uri!r} is not a valid URL"
        path = str(self.path)
        full = os.path.join(workspace, path) if workspace and not os.path.isabs(path) else path
        if self.kind == "dir":
            return None if os.path.isdir(full) else f"directory {full!r} does not exist"
        if os.path.isfile(full):
            return None
        return f"{self.kind} {full!r} does not exist"


@dataclass(frozen=True)
class EnvSpec:
    """The environment a task needs: its kind and the capabilities it must offer."""

    kind: str = "host"
    capabilities: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """An environment the agent acts in. ``capabilities`` is checked against a Task's EnvSpec."""

    capabilities: frozenset[str]

    def reset(self, task: Task) -> Any:
        """Prepare for ``task``; return the initial observation."""
        ...

    def step(self, actions: Sequence[Any]) -> Any:
        """Carry out the actions of one decision; return the observation."""
        ...

    def is_terminal(self) -> bool:
        """True when the environment has reached an end state."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


def _task_id() -> str:
    return f"task-{os.urandom(6).hex()}"


@dataclass(frozen=True)
class Task:
    """A structured task: what to achieve, with which resources, under which constraints and budget."""

    id: str = field(default_factory=_task_id)
    objective: str = ""
    resources: Sequence[TaskResource] = ()
    env_spec: EnvSpec | None = None
    constraints: Mapping[str, Any] = field(default_factory=dict)
    success_criteria: Sequence[str] = ()
    budget: TaskBudget = field(default_factory=TaskBudget)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.objective, str):
            raise TaskValidationError(f"Task.objective must be a string, got {type(self.objective).__name__}")
        for resource in self.resources:
            if not isinstance(resource, TaskResource):
                raise TaskValidationError(f"Task.resources takes TaskResource items, got {resource!r}")
        if not isinstance(self.budget, TaskBudget):
            raise TaskValidationError(f"Task.budget must be a TaskBudget, got {type(self.budget).__name__}")
        # Text that has no UTF-8 form (a lone surrogate) could never be stored or sent: refuse it here.
        for key, value in self.to_dict().items():
            check_text(value, f"Task.{key}")

    @classmethod
    def coerce(cls, task: str | Task) -> Task:
        """A Task from a Task or an objective string."""
        if isinstance(task, Task):
            return task
        if isinstance(task, str):
            return cls(objective=task)
        raise TaskValidationError(f"a task is a str or a Task, got {type(task).__name__}")

    def missing_resources(self, workspace: str | None = None) -> list[str]:
        """Problems with the required resources (empty when all are present)."""
        problems = []
        for resource in self.resources:
            if resource.required:
                problem = resource.problem(workspace)
                if problem:
                    problems.append(problem)
        return problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form, for traces and session records; :meth:`from_dict` rebuilds an equal Task
        (sequences come back as tuples). Mappings are copied as given: keep their values JSON-native."""
        env = self.env_spec
        return {
            "id": self.id,
            "objective": self.objective,
            "resources": [
                {
                    "kind": r.kind,
                    "path": r.path,
                    "uri": r.uri,
                    "required": r.required,
                    "description": r.description,
                }
                for r in self.resources
            ],
            "env_spec": None
            if env is None
            else {"kind": env.kind, "capabilities": list(env.capabilities), "config": dict(env.config)},
            "success_criteria": list(self.success_criteria),
            "constraints": dict(self.constraints),
            "budget": {
                "max_steps": self.budget.max_steps,
                "max_runtime_seconds": self.budget.max_runtime_seconds,
                "max_tokens": self.budget.max_tokens,
            },
            "metadata": dict(self.metadata),
            "inputs": dict(self.inputs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Inverse of :meth:`to_dict`. Also reads older records whose resources carry only ``location``."""
        budget = data.get("budget") or {}
        env = data.get("env_spec")
        return cls(
            id=str(data.get("id") or _task_id()),
            objective=str(data.get("objective", "")),
            resources=tuple(_resource_from_dict(r) for r in data.get("resources") or ()),
            env_spec=None
            if env is None
            else EnvSpec(
                kind=env.get("kind", "host"),
                capabilities=tuple(env.get("capabilities") or ()),
                config=dict(env.get("config") or {}),
            ),
            constraints=dict(data.get("constraints") or {}),
            success_criteria=tuple(data.get("success_criteria") or ()),
            budget=TaskBudget(
                max_steps=budget.get("max_steps"),
                max_runtime_seconds=budget.get("max_runtime_seconds"),
                max_tokens=budget.get("max_tokens"),
            ),
            inputs=dict(data.get("inputs") or {}),
            metadata=dict(data.get("metadata") or {}),
        )


def _resource_from_dict(data: Mapping[str, Any]) -> TaskResource:
    path, uri = data.get("path"), data.get("uri")
    location = data.get("location")  # the older summary form kept one location instead of path/uri
    if path is None and uri is None and location is not None:
        if data.get("kind") == "url":
            uri = location
        else:
            path = location
    return TaskResource(
        kind=data["kind"],
        path=path,
        uri=uri,
        required=bool(data.get("required", True)),
        description=data.get("description"),
    )


@dataclass(frozen=True)
class TaskResult:
    """The structured outcome of running a task."""

    task_id: str
    status: Literal["completed", "stopped", "failed"]
    stop_reason: str | None
    final_result: str | None
    steps: int
    success_criteria: tuple[str, ...] = ()
    error: str | None = None
    elapsed_seconds: float = 0.0
    token_usage: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {
            "task_id": self.task_id,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "final_result": self.final_result,
            "steps": self.steps,
            "success_criteria": list(self.success_criteria),
            "error": self.error,
            "elapsed_seconds": round(self.elapsed_seconds, 6),
            "token_usage": dict(self.token_usage),
        }
