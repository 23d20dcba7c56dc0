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
from uuid import UUID

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ValidationError
from django.db import transaction

from django_jobs import encryption, lifecycle, payloads, signals
from django_jobs.attempts import DeadReason, error_entry
from django_jobs.context import ChunkContext, JobContext
from django_jobs.exceptions import ChunkFailed, FatalError, JobCancelled, LeaseLost, Snooze
from django_jobs.lifecycle import Outcome
from django_jobs.registry import Handler
from django_jobs.rows import ClaimedJob
from django_jobs.store import JobStore
from django_jobs.worker.runs import ChunkRun, Run


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


# ---- chunk handlers (docs/handlers.md#chunk-handlers) ----------------------------


def chunk_outcomes(
    chunk: ChunkRun, worker_id: str, store: JobStore, database: str
) -> list[Outcome]:
    """Run a chunk handler on this thread over its runs; return each run's outcome, in order.

    A run whose payload does not decode or validate (or that was cancelled while it
    waited) gets its own outcome and is left out of the call. As outcome_of, it never
    raises.
    """
    handler, runs = chunk.handler, chunk.runs
    outcomes: list[Outcome | None] = []
    called: list[int] = []  # positions in runs of the payloads the handler receives
    chunk_payloads: list[Any] = []
    for index, run in enumerate(runs):
        payload, outcome = _begin(run, worker_id)
        outcomes.append(outcome)
        if outcome is None:
            called.append(index)
            chunk_payloads.append(payload)
    if called:
        members = [runs[i] for i in called]
        if handler.atomic:
            got = _chunk_atomic(handler, members, chunk_payloads, worker_id, store, database)
        else:
            got, _ = _chunk_call(handler, members, chunk_payloads, worker_id)
        for index, outcome in zip(called, got, strict=True):
            outcomes[index] = outcome
    return [outcome for outcome in outcomes if outcome is not None]


def _chunk_call(
    handler: Handler, runs: list[Run], chunk_payloads: list[Any], worker_id: str
) -> tuple[list[Outcome], bool]:
    """Call the chunk handler once: each run's outcome, and whether the whole call failed."""
    first = runs[0]
    assert first.ctx is not None  # a run handed out has one
    contexts = [run.ctx for run in runs if run.ctx is not None]
    ctx = ChunkContext(first.job.name, first.job.queue, first.ctx.worker_id, contexts)
    try:
        if signals.job_started.receivers:
            for run in runs:
                job = run.job
                signals.send(signals.job_started, **signals.about(job), attempt=job.attempts)
        chunk_func: Any = handler.func  # called with the payloads and a ChunkContext
        returned = chunk_func(chunk_payloads, ctx)
        failures: dict[int, BaseException] = {}
        results: Any = returned
    except ChunkFailed as exc:
        try:
            failures = _named(exc, runs)
        except TypeError as refused:
            return _all_failed(runs, chunk_payloads, handler, refused, worker_id), True
        results = exc.results
    except BaseException as exc:  # noqa: BLE001 - a handler may raise anything
        return _all_failed(runs, chunk_payloads, handler, exc, worker_id), True
    if results is not None and (not isinstance(results, list) or len(results) != len(runs)):
        bad = TypeError(
            f"chunk handler {handler.name} returned {type(results).__name__}"
            + (f" of {len(results)}" if isinstance(results, list) else "")
            + f": return None or a list of one result per payload ({len(runs)})"
        )
        return _all_failed(runs, chunk_payloads, handler, bad, worker_id), True
    outcomes: list[Outcome] = []
    for index, (run, payload) in enumerate(zip(runs, chunk_payloads, strict=True)):
        failed = failures.get(index)
        if failed is None:
            try:
                value = None if results is None else results[index]
                outcomes.append(lifecycle.Succeeded(_stored(handler, value)))
                continue
            except BaseException as exc:  # noqa: BLE001 - an unstorable result fails its job
                failed = exc
        outcomes.append(_hidden(_raised(run.job, failed, worker_id), handler, payload))
    return outcomes, False


def _named(exc: ChunkFailed, runs: list[Run]) -> dict[int, BaseException]:
    """Return ChunkFailed's failures by position in runs; TypeError for a key naming none."""
    positions = {str(run.job.id): index for index, run in enumerate(runs)}
    named: dict[int, BaseException] = {}
    for key, error in exc.failures.items():
        if type(key) is int and 0 <= key < len(runs):
            index = key
        elif isinstance(key, str | UUID) and str(key) in positions:
            index = positions[str(key)]
        else:
            raise TypeError(
                f"ChunkFailed names {key!r}, which is neither a job id of the chunk "
                f"(ctx.jobs[i].id) nor a payload's index (0..{len(runs) - 1})"
            )
        if not isinstance(error, BaseException):
            raise TypeError(f"ChunkFailed maps {key!r} to {error!r}: map it to an exception")
        named[index] = error
    return named


def _all_failed(
    runs: list[Run], chunk_payloads: list[Any], handler: Handler, exc: BaseException, worker_id: str
) -> list[Outcome]:
    """Return each run's outcome when the whole chunk failed with exc."""
    return [
        _hidden(_raised(run.job, exc, worker_id), handler, payload)
        for run, payload in zip(runs, chunk_payloads, strict=True)
    ]


class _ChunkAbort(Exception):
    """Roll an atomic chunk back: `index` (or None: every run) met `outcome`."""

    def __init__(self, index: int | None, outcome: Outcome | None = None) -> None:
        self.index, self.outcome = index, outcome


def _chunk_atomic(
    handler: Handler,
    runs: list[Run],
    chunk_payloads: list[Any],
    worker_id: str,
    store: JobStore,
    database: str,
) -> list[Outcome]:
    """Run an atomic chunk: its effects, the done jobs' markers and deletions in one transaction.

    A failure of the whole chunk rolls everything back and every job fails; with
    ChunkFailed, the effects commit with the markers of the jobs it did not name,
    and the named jobs are retried. A job whose marker exists, or whose lease was
    lost, rolls the chunk back: that job is settled as the single-job atomic path
    settles it, the others are given back unstarted (their attempt not counted).
    """
    outcomes: list[Outcome] = []
    try:
        with transaction.atomic(using=database):
            outcomes, whole = _chunk_call(handler, runs, chunk_payloads, worker_id)
            if whole:
                raise _ChunkAbort(None)
            for index, (run, outcome) in enumerate(zip(runs, outcomes, strict=True)):
                if type(outcome) is not lifecycle.Succeeded:
                    continue
                if run.abandoned:
                    raise _ChunkAbort(index, lifecycle.Lost())
                try:
                    if not store.complete_atomically(run.job, outcome.result):
                        raise _ChunkAbort(index, lifecycle.AlreadyDone())
                except LeaseLost:
                    raise _ChunkAbort(index, lifecycle.Lost()) from None
                outcomes[index] = lifecycle.SettledAtomically()
    except _ChunkAbort as abort:
        if abort.index is None:
            return outcomes
        return [
            abort.outcome
            if index == abort.index and abort.outcome is not None
            else outcome
            if isinstance(outcome, lifecycle.Failed | lifecycle.Snoozed)
            else lifecycle.Unstarted()
            for index, outcome in enumerate(outcomes)
        ]
    return outcomes
