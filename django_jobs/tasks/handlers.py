"""django.tasks Tasks as django-jobs handlers: their registry entries, policies and payloads.

Each Task whose backend is a ``JobsBackend`` is registered in ``django_jobs.registry``
under its module path as a ``TaskHandler``: a small runner that calls the task
function with the args and kwargs of the job's payload. The worker needs no
special path for tasks: it finds them by name like any handler, so retries,
leases, timeouts, completion markers, dead letters and replays work the same,
and a row naming anything else (``os.system``) is dead-lettered without an import.

The runner (``runner.py``) calls the task function; ``results.py`` reads results.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.tasks import Task

from django_jobs import payloads, registry
from django_jobs.exceptions import InvalidTaskArguments
from django_jobs.registry import Backoff, Handler
from django_jobs.tasks import runner


@dataclass(frozen=True, slots=True)
class Policy:
    """A task's retry policy; None means the DJANGO_JOBS default."""

    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None
    atomic: bool = False


@dataclass(slots=True)
class TaskHandler(Handler):
    """The registry entry of a django.tasks Task: a runner plus the Task it runs."""

    task: Task[..., Any] | None = None
    policy: Policy | None = None


def register(task: Task[..., Any], policy: Policy) -> TaskHandler:
    """Register task (or refresh its policy) and return its handler.

    Raises HandlerConflict when a native @job already holds the task's name.
    """
    existing = registry.lookup(task.module_path)
    if (
        isinstance(existing, TaskHandler)
        and existing.task is not None
        and existing.task.func is task.func
    ):
        if existing.policy == policy:
            return existing
        # Keep the declared Task, not a .using() variant of it.
        task = existing.task
    handler = TaskHandler(
        func=runner.build(task),
        name=task.module_path,
        queue=task.queue_name,
        priority=task.priority,
        max_attempts=policy.max_attempts,
        backoff=policy.backoff,
        timeout=policy.timeout,
        atomic=policy.atomic,
        validate=check_payload,
        task=task,
        policy=policy,
    )
    registry.register(handler)
    runner.listen()
    return handler


def payload(args: Iterable[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Return the job payload of a call, or raise InvalidTaskArguments if it is not JSON.

    The task function receives exactly what JSON gives back, so anything that would
    come back different (a datetime, a set, a model instance, bytes, NaN, an int
    dict key) is refused here rather than surprising the task later. Tuples are
    accepted and arrive as lists, as in Django's own TaskResult.args.
    """
    call = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        text = json.dumps(call, allow_nan=False, default=_not_json)
        # The round trip below proves it is call's shape: a dict of args and kwargs.
        decoded: dict[str, Any] = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidTaskArguments(f"task arguments must be JSON: {exc}") from exc
    if not _same_json(decoded, call):
        raise InvalidTaskArguments(
            "task arguments must survive a JSON round trip unchanged (JSON types only: dict "
            "with str keys, list, str, int, float, bool, None); pass ids, not objects"
        )
    return decoded


def _not_json(o: Any) -> Any:
    payloads.refuse_model_instance(o)  # the hint enqueue() gives: pass its primary key
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _kind(value: Any) -> type | None:
    for kind in (bool, int, float, str):  # bool first: it is an int too
        if isinstance(value, kind):
            return kind
    return None


def _same_json(decoded: Any, original: Any) -> bool:
    # Compare kinds too: True == 1 and 1 == 1.0 in Python, but JSON tells them apart.
    if isinstance(original, tuple | list):
        return (
            isinstance(decoded, list)
            and len(decoded) == len(original)
            and all(_same_json(d, o) for d, o in zip(decoded, original, strict=True))
        )
    if isinstance(original, dict):
        return (
            isinstance(decoded, dict)
            and all(isinstance(k, str) for k in original)
            and decoded.keys() == original.keys()
            and all(_same_json(decoded[k], v) for k, v in original.items())
        )
    return _kind(decoded) is _kind(original) and decoded == original


def check_payload(value: Any) -> None:
    """Refuse a payload that is not {"args": [...], "kwargs": {...}} (dead-letters the job)."""
    if (
        not isinstance(value, dict)
        or value.keys() != {"args", "kwargs"}
        or not isinstance(value["args"], list)
        or not isinstance(value["kwargs"], dict)
    ):
        raise ValueError('a django.tasks job payload is {"args": [...], "kwargs": {...}}')
