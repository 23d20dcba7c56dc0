"""One attempt of a claimed job: validate, run the handler, turn what happened into an Outcome.

Both executors call this module, the threads through ``outcome_of`` and the event
loop through ``aoutcome_of``; the two differ only in how the handler is called
(``call_handler`` or ``await``), so what an attempt's outcome is (and where a span or a
log line around an attempt goes: ``attempt_scope``) is decided in one place.
Nothing here raises: whatever a handler or its validator raises, any
BaseException included, is a recorded outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ValidationError
from django.db import transaction

from django_jobs import encryption, lifecycle, payloads, signals
from django_jobs.attempts import DeadReason, error_entry
from django_jobs.context import JobContext
from django_jobs.exceptions import FatalError, JobCancelled, LeaseLost, Snooze
from django_jobs.lifecycle import Outcome
from django_jobs.registry import Handler
from django_jobs.rows import ClaimedJob
from django_jobs.store import JobStore
from django_jobs.worker.runs import Run


@contextmanager
def attempt_scope(run: Run) -> Iterator[None]:
    """Wrap one attempt's handler call (both executors enter it once per attempt)."""
    yield


def failure(
    job: ClaimedJob, exc: BaseException, worker_id: str, fatal: bool = False
) -> lifecycle.Failed:
    """Return the Failed outcome of exc, as recorded for the attempt."""
    return lifecycle.Failed(
        error_entry(job.attempts, exc=exc, worker=worker_id), fatal=fatal, exc=exc
    )


def _begin(run: Run, worker_id: str) -> tuple[Any, None] | tuple[None, Outcome]:
    """Decode and validate the payload: (payload, None), or (None, the attempt's outcome)."""
    job, handler = run.job, run.handler
    assert handler is not None  # a run handed out has one
    if run.cancel_requested:  # cancelled while it waited for a thread or a loop slot
        return None, failure(job, JobCancelled("cancelled before it started"), worker_id)
    try:
        payload = encryption.unseal(payloads.decode(job.payload), handler.encrypt)
    except encryption.Undecryptable as exc:
        error = error_entry(job.attempts, exc=exc, worker=worker_id)
        return None, lifecycle.Invalid(error, DeadReason.UNDECRYPTABLE)
    except (ValueError, TypeError) as exc:
        return None, lifecycle.Invalid(error_entry(job.attempts, exc=exc, worker=worker_id))
    except BaseException as exc:  # noqa: BLE001 - keys that cannot load: fail the attempt
        return None, failure(job, exc, worker_id)
    try:
        if handler.validate is not None:
            validated = handler.validate(payload)
            payload = payload if validated is None else validated
    except (ValueError, TypeError, ValidationError) as exc:
        error = error_entry(job.attempts, exc=exc, worker=worker_id)
        return None, lifecycle.Invalid(encryption.redact(error, payload, handler.encrypt))
    except BaseException as exc:  # noqa: BLE001 - a validator that breaks fails the attempt
        return None, _hidden(failure(job, exc, worker_id), handler, payload)
    return payload, None


def _hidden(outcome: Outcome, handler: Handler, payload: Any) -> Outcome:
    """Return a failed attempt's outcome with an encrypting handler's secrets hidden in
    its stored error (encryption.redact)."""
    if handler.encrypt is not None and isinstance(outcome, lifecycle.Failed):
        outcome.error = encryption.redact(outcome.error, payload, handler.encrypt)
    return outcome


def _raised(job: ClaimedJob, exc: BaseException, worker_id: str) -> Outcome:
    """Return the outcome of a handler that raised exc."""
    if isinstance(exc, Snooze):
        seconds = getattr(exc, "seconds", None)
        if type(seconds) is float and 0.0 <= seconds <= Snooze.MAX_SECONDS:
            return lifecycle.Snoozed(seconds)
        return failure(job, exc, worker_id)  # a Snooze tampered with after it was made
    return failure(job, exc, worker_id, fatal=isinstance(exc, FatalError))


def outcome_of(run: Run, worker_id: str, store: JobStore, database: str) -> Outcome:
    """Run a claimed job's handler on this thread and return what happened; never raise.

    Whatever the handler or its validator raises, any BaseException included
    (KeyboardInterrupt, SystemExit, CancelledError, GeneratorExit), is a failed
    attempt: executors are not the main thread, so the worker's own
    SIGINT/SIGTERM handling never meets it.
    """
    job, handler, ctx = run.job, run.handler, run.ctx
    assert handler is not None and ctx is not None  # a run handed out has both
    payload, outcome = _begin(run, worker_id)
    if outcome is not None:
        return outcome
    with attempt_scope(run):
        try:
            if signals.job_started.receivers:
                signals.send(signals.job_started, **signals.about(job), attempt=job.attempts)
            if handler.atomic:
                return _run_atomic(run, payload, store, database)
            return lifecycle.Succeeded(_stored(handler, call_handler(handler, payload, ctx)))
        except BaseException as exc:  # noqa: BLE001 - a handler may raise anything
            return _hidden(_raised(job, exc, worker_id), handler, payload)


async def aoutcome_of(run: Run, worker_id: str) -> Outcome:
    """Await a claimed job's async handler on the worker's loop and return what happened.

    As outcome_of, it never raises, with one exception: the CancelledError of
    the worker's own cancellation (its timeout, its shutdown), which the
    caller sees through the task's cancelling() count. A CancelledError the
    handler's own awaits raise (a cancelled inner task, say) is a failed
    attempt with that cause.
    """
    job, handler, ctx = run.job, run.handler, run.ctx
    assert handler is not None and ctx is not None  # a run handed out has both
    if handler.validate is None:
        payload, outcome = _begin(run, worker_id)
    else:  # a validator is sync code, which may use the ORM: on the worker's ORM threads
        payload, outcome = await sync_to_async(_begin)(run, worker_id)
    if outcome is not None:
        return outcome
    with attempt_scope(run):
        try:
            if signals.job_started.receivers:  # sync receivers run on the ORM threads
                await signals.job_started.asend(**signals.about(job), attempt=job.attempts)
            result = await handler.func(payload, ctx)
            return lifecycle.Succeeded(_stored(handler, result))
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the worker cancelled it: the caller reports why
            return _hidden(failure(job, exc, worker_id), handler, payload)
        except BaseException as exc:  # noqa: BLE001 - a handler may raise anything
            return _hidden(_raised(job, exc, worker_id), handler, payload)


def _run_atomic(run: Run, payload: Any, store: JobStore, database: str) -> Outcome:
    job, handler, ctx = run.job, run.handler, run.ctx
    assert handler is not None and ctx is not None  # a run handed out has both
    try:
        with transaction.atomic(using=database):
            result = _stored(handler, call_handler(handler, payload, ctx))
            if run.abandoned:
                raise LeaseLost(f"job {job.id} timed out or was released; rolling back")
            if not store.complete_atomically(job, result):
                raise _MarkerExists
    except _MarkerExists:
        return lifecycle.AlreadyDone()
    except LeaseLost:
        return lifecycle.Lost()
    return lifecycle.SettledAtomically()


def _stored(handler: Handler, value: Any) -> str | None:
    """Return a handler's result as its completion marker keeps it: JSON, encrypted if asked."""
    text = payloads.encode_result(value)
    return text if handler.encrypt is None else encryption.seal_result(text)


class _MarkerExists(Exception):
    pass


def call_handler(handler: Handler, payload: Any, ctx: JobContext) -> Any:
    """Call handler on this thread (an async one through async_to_sync)."""
    if handler.is_async:
        # async_to_sync sends the coroutine's thread-sensitive sync_to_async calls
        # (the ORM) back to this thread, so they use this thread's connection.
        return async_to_sync(handler.func)(payload, ctx)
    return handler.func(payload, ctx)
