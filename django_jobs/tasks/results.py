"""TaskResults for django.tasks, read from wherever a task's job is now.

A job's id is its TaskResult's id. A live job is READY or RUNNING, a completion
marker SUCCESSFUL, a dead letter FAILED. The Task of a result comes from the
registry by the row's name: nothing here imports a name read from a row, and a
row whose name is not a registered Task has no TaskResult.

A marker has no payload or attempt history of its own, so a task's handler
returns an *envelope* that the marker keeps as its result: the return value,
the arguments, the attempt time, and the worker id and error of every attempt.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils.dateparse import parse_datetime

from django_jobs import conf, payloads, registry
from django_jobs.attempts import worker_of

if TYPE_CHECKING:
    from django_jobs.models import CompletionMarker, DeadLetter, Job

# Types the worker records for attempts that raised nothing; TaskError.exception_class
# imports its path, so point these at real classes.
_PSEUDO_TYPES = {
    "django_jobs.LeaseExpired": "django_jobs.exceptions.LeaseExpired",
    "django_jobs.UnknownJob": "django_jobs.exceptions.UnknownJob",
}
_ENVELOPE_KEYS = frozenset(
    {"return_value", "args", "kwargs", "attempted_at", "worker_ids", "errors"}
)


def registered_task(name: str) -> Task[..., Any] | None:
    """Return the Task registered under a job name, or None (never imports the name)."""
    # Only a TaskHandler (tasks.handlers, which imports this module) has a task.
    task = getattr(registry.lookup(name), "task", None)
    return task if isinstance(task, Task) else None


def task_error(entry: dict[str, Any]) -> TaskError:
    """Turn one entry of a job's errors list into Django's TaskError."""
    kind = str(entry.get("type") or "builtins.Exception")
    text = entry.get("traceback") or f"{kind}: {entry.get('message', '')}"
    return TaskError(exception_class_path=_PSEUDO_TYPES.get(kind, kind), traceback=str(text))


def fit(workers: Sequence[str], attempts: int) -> list[str]:
    """Return one worker id per attempt (TaskResult.attempts is len(worker_ids))."""
    kept = list(workers)[-attempts:] if attempts > 0 else []
    return [""] * (attempts - len(kept)) + kept


def workers_of(errors: Sequence[dict[str, Any]]) -> list[str]:
    return [str(entry.get("worker") or "") for entry in errors]


def envelope(
    value: Any, result: TaskResult[..., Any], *, errors: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Return what a task's marker keeps: its return value and what the marker lacks."""
    attempted = result.last_attempted_at
    return {
        "return_value": value,
        "args": result.args,
        "kwargs": result.kwargs,
        "attempted_at": attempted.isoformat() if attempted else None,
        "worker_ids": list(result.worker_ids),
        # Earlier attempts' errors (worker_ids says who ran them).
        "errors": [
            {"type": e.get("type"), "message": e.get("message"), "traceback": e.get("traceback")}
            for e in errors
        ],
    }


def for_row(task: Task[..., Any], queue: str, priority: int | None = None) -> Task[..., Any]:
    """Return task as enqueued: with the row's queue and priority."""
    if task.queue_name == queue and (priority is None or task.priority == priority):
        return task
    try:
        return task.using(queue_name=queue, priority=priority)
    except InvalidTask:
        # The settings changed since (a queue was removed): show the declared Task.
        return task


@dataclass(frozen=True, slots=True)
class _Arguments:
    args: list[Any]
    kwargs: dict[str, Any]


def _arguments(text: str) -> _Arguments:
    try:
        payload = payloads.decode(text)
    except ValueError:
        return _Arguments([], {})
    if not isinstance(payload, dict):
        return _Arguments([], {})
    args, kwargs = payload.get("args"), payload.get("kwargs")
    return _Arguments(
        args if isinstance(args, list) else [], kwargs if isinstance(kwargs, dict) else {}
    )


def _parse_id(result_id: object) -> uuid.UUID:
    if isinstance(result_id, uuid.UUID):
        return result_id
    try:
        return uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None


def _when(text: object) -> datetime | None:
    if isinstance(text, datetime):
        return text
    if not isinstance(text, str):
        return None
    try:
        return parse_datetime(text)
    except ValueError:
        return None


def _not_a_task(result_id: object, name: str) -> TaskResultDoesNotExist:
    return TaskResultDoesNotExist(
        f"{result_id} is a job named {name!r}, which is not a django.tasks Task of this project"
    )


def _make(
    task: Task[..., Any], result_id: uuid.UUID, status: TaskResultStatus, **fields: Any
) -> TaskResult[..., Any]:
    return_value = fields.pop("return_value", None)
    result: TaskResult[..., Any] = TaskResult(
        task=task, id=str(result_id), status=status, backend=task.backend, **fields
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)
    return result


def lookup(result_id: object) -> TaskResult[..., Any]:
    """Return the TaskResult of a task's job id, or raise TaskResultDoesNotExist.

    Looks at the live jobs, then the markers, then the dead letters: a job moves
    to a marker or a dead letter in one transaction, so reading in this order
    cannot miss it.
    """
    from django_jobs.models import CompletionMarker, DeadLetter, Job

    job_id = _parse_id(result_id)
    for alias in conf.databases():  # a job is in one of them (docs/scaling.md)
        job = Job.objects.using(alias).filter(id=job_id).with_running().first()
        if job is not None:
            # with_running() annotated `running`, which the model's type cannot show.
            return _from_job(job, running=job.running)  # type: ignore[attr-defined]
        marker = CompletionMarker.objects.using(alias).filter(job_id=job_id).first()
        if marker is not None:
            return _from_marker(marker)
        letter = DeadLetter.objects.using(alias).filter(id=job_id).first()
        if letter is not None:
            return _from_dead_letter(letter)
    raise TaskResultDoesNotExist(result_id)


def _from_job(job: Job, *, running: bool) -> TaskResult[..., Any]:
    task = registered_task(job.name)
    if task is None:
        raise _not_a_task(job.id, job.name)
    errors = list(job.errors or [])
    workers = workers_of(errors)
    if job.locked_by:
        # Held, or held by a worker whose lease ran out (rescue notes that attempt later).
        workers.append(worker_of(job.locked_by))
    arguments = _arguments(job.payload)
    return _make(
        for_row(task, job.queue, job.priority),
        job.id,
        TaskResultStatus.RUNNING if running else TaskResultStatus.READY,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        finished_at=None,
        last_attempted_at=job.attempted_at,
        args=arguments.args,
        kwargs=arguments.kwargs,
        errors=[task_error(e) for e in errors],
        worker_ids=fit(workers, job.attempts),
    )


def _from_marker(marker: CompletionMarker) -> TaskResult[..., Any]:
    task = registered_task(marker.name)
    if task is None:
        raise _not_a_task(marker.job_id, marker.name)
    data = marker.result
    if isinstance(data, dict) and _ENVELOPE_KEYS <= data.keys():
        value = data["return_value"]
        args = data["args"] if isinstance(data["args"], list) else []
        kwargs = data["kwargs"] if isinstance(data["kwargs"], dict) else {}
        attempted = _when(data["attempted_at"])
        workers = [str(w) for w in data["worker_ids"] or []]
        errors = [task_error(e) for e in data["errors"] or [] if isinstance(e, dict)]
    else:
        # Settled without the task's handler (completed by a native enqueue of its name).
        value, args, kwargs, attempted, workers, errors = data, [], {}, None, [], []
    if not workers or workers[-1] != marker.worker_id:
        workers.append(marker.worker_id)
    return _make(
        for_row(task, marker.queue),
        marker.job_id,
        TaskResultStatus.SUCCESSFUL,
        enqueued_at=marker.enqueued_at,
        started_at=marker.started_at,
        finished_at=marker.completed_at,
        last_attempted_at=attempted or marker.started_at,
        args=args,
        kwargs=kwargs,
        errors=errors,
        worker_ids=fit(workers, marker.attempts),
        return_value=value,
    )


def _from_dead_letter(letter: DeadLetter) -> TaskResult[..., Any]:
    task = registered_task(letter.name)
    if task is None:
        raise _not_a_task(letter.id, letter.name)
    errors = [e for e in letter.errors or [] if isinstance(e, dict)]
    arguments = _arguments(letter.payload)
    last = _when(errors[-1].get("at")) if errors else None
    return _make(
        for_row(task, letter.queue, letter.priority),
        letter.id,
        TaskResultStatus.FAILED,
        enqueued_at=letter.enqueued_at,
        started_at=letter.started_at,
        finished_at=letter.dead_at,
        last_attempted_at=last or letter.started_at,
        args=arguments.args,
        kwargs=arguments.kwargs,
        errors=[task_error(e) for e in errors],
        worker_ids=fit(workers_of(errors), letter.attempts),
    )
