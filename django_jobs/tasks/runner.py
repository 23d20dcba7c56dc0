"""Running a django.tasks Task on the worker, and Django's task signals.

``task_started`` is sent by the runner in the executor thread, just before the
task function runs; ``task_finished`` once the outcome is settled in the
database (SUCCESSFUL or FAILED; a failed attempt that will be retried is not
finished), from the worker's ``job_finished`` signal.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any

from django.db import DatabaseError
from django.dispatch import Signal
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_jobs import signals
from django_jobs.attempts import MAX_MESSAGE
from django_jobs.context import JobContext
from django_jobs.tasks import results

logger = logging.getLogger(__name__)

# Results of running tasks, kept from task_started until their outcome is settled.
# Bounded: a job whose lease was taken over never reports back to this worker.
_RUNNING_LIMIT = 10_000
_running: OrderedDict[uuid.UUID, TaskResult[..., Any]] = OrderedDict()
_running_lock = threading.Lock()


def build(task: Task[..., Any]) -> Callable[..., Any]:
    """Return the handler function that runs task with a job's payload on the worker."""
    func = task.func

    if iscoroutinefunction(func):

        async def run_async(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            result = _started(task, payload, ctx)
            await _asend(task_started, task, result)
            value = await func(*_call_args(task, result, payload), **payload["kwargs"])
            return _returned(result, value, ctx)

        run: Callable[..., Any] = run_async

    else:

        def run_sync(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            result = _started(task, payload, ctx)
            _send(task_started, task, result)
            value = func(*_call_args(task, result, payload), **payload["kwargs"])
            return _returned(result, value, ctx)

        run = run_sync

    # The registry tells functions apart by origin: this runner stands for the task function.
    run.__module__ = func.__module__
    run.__qualname__ = func.__qualname__
    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


def _call_args(
    task: Task[..., Any], result: TaskResult[..., Any], payload: dict[str, Any]
) -> list[Any]:
    if task.takes_context:
        return [TaskContext(task_result=result), *payload["args"]]
    args: list[Any] = payload["args"]  # check_payload refused any other payload
    return args


def _started(
    task: Task[..., Any], payload: dict[str, Any], ctx: JobContext
) -> TaskResult[..., Any]:
    """Build the RUNNING TaskResult of this attempt and keep it until the outcome is settled."""
    now = timezone.now()
    # The claim set started_at for the first attempt: that is this attempt's start too.
    attempted = ctx.started_at if ctx.attempt == 1 and ctx.started_at else now
    result: TaskResult[..., Any] = TaskResult(
        task=results.for_row(task, ctx.queue),
        id=str(ctx.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=ctx.enqueued_at,
        started_at=ctx.started_at or attempted,
        finished_at=None,
        last_attempted_at=attempted,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=task.backend,
        errors=[results.task_error(e) for e in ctx.errors],
        # One per attempt: TaskContext.attempt is len(worker_ids).
        worker_ids=[
            *results.fit(results.workers_of(ctx.errors), ctx.attempt - 1),
            ctx.worker_id,
        ],
    )
    with _running_lock:
        _running[ctx.id] = result
        while len(_running) > _RUNNING_LIMIT:
            _running.popitem(last=False)
    return result


def _returned(result: TaskResult[..., Any], value: Any, ctx: JobContext) -> dict[str, Any]:
    # As Django's own backends do: tuples become lists; other non-JSON values fail the attempt.
    value = normalize_json(value)
    object.__setattr__(result, "_return_value", value)
    return results.envelope(value, result, errors=ctx.errors)


def _on_job_finished(
    sender: Any, *, job_id: uuid.UUID, name: str, outcome: str, error: Any = None, **kwargs: Any
) -> None:
    """Send task_finished once a task's outcome is settled (in the worker's dispatcher thread)."""
    with _running_lock:
        result = _running.pop(job_id, None)
    task = results.registered_task(name)
    if task is None or outcome not in ("succeeded", "dead"):
        return
    if outcome == "succeeded" and result is not None:
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "finished_at", timezone.now())
    else:
        # Dead letters (errors as stored), and jobs settled without running here.
        try:
            result = results.lookup(job_id)
        except (TaskResultDoesNotExist, DatabaseError):
            logger.warning(
                "task_finished not sent for job %s: its result could not be read",
                job_id,
                exc_info=True,
            )
            return
    if result.status == TaskResultStatus.FAILED and _loggable(error):
        _send_in_handler(error, task, result)
    else:
        _send(task_finished, task, result)


def listen() -> None:
    """Send task_finished from now on (called as a Task is registered: without Tasks, a
    worker's jobs pay for no receiver)."""
    signals.job_finished.connect(_on_job_finished, dispatch_uid="django_jobs.tasks.runner")


def _loggable(error: Any) -> bool:
    """True when error can go whole into a log line: an exception whose text formats and is short.

    The stored error is capped and made storable; a megabyte message or a __str__
    that raises must not reach the log (or crash the dispatcher) through exc_info.
    """
    if not isinstance(error, BaseException):
        return False
    try:
        return len(str(error)) <= MAX_MESSAGE
    except BaseException:  # noqa: BLE001 - a hostile __str__ may raise anything
        return False


def _send_in_handler(
    error: BaseException, task: Task[..., Any], result: TaskResult[..., Any]
) -> None:
    """Send task_finished while handling error, as Django's own backends do.

    Django's receiver logs the FAILED line with sys.exc_info(), which only an
    except block sets; the exception's traceback and context are restored after.
    """
    traceback, context = error.__traceback__, error.__context__
    try:
        raise error
    except BaseException:
        _send(task_finished, task, result)
    finally:
        error.__traceback__, error.__context__ = traceback, context


def _send(signal: Signal, task: Task[..., Any], result: TaskResult[..., Any]) -> None:
    # A failing receiver must neither fail the task nor stop the worker: log it.
    for receiver, response in signal.send_robust(
        sender=type(task.get_backend()), task_result=result
    ):
        if isinstance(response, Exception):
            _log_receiver_error(receiver, response, result)


async def _asend(signal: Signal, task: Task[..., Any], result: TaskResult[..., Any]) -> None:
    for receiver, response in await signal.asend_robust(
        sender=type(task.get_backend()), task_result=result
    ):
        if isinstance(response, Exception):
            _log_receiver_error(receiver, response, result)


def _log_receiver_error(receiver: Any, error: Exception, result: TaskResult[..., Any]) -> None:
    logger.error(
        "signal receiver %r raised for task %s",
        receiver,
        result.id,
        exc_info=(type(error), error, error.__traceback__),
    )


def send_enqueued(task: Task[..., Any], result: TaskResult[..., Any]) -> None:
    """Send task_enqueued (called once the job's transaction commits)."""
    from django.tasks.signals import task_enqueued

    _send(task_enqueued, task, result)
