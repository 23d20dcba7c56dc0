"""The worker driven from the caller's thread, on the caller's connection: the seam of drain().

``InlineWorker`` is a ``Worker`` whose rounds the caller runs one at a time:
``round(limit)`` claims up to limit due jobs, runs each here in claim order and
settles it at once, then returns what happened to each (``Reported``). Everything
but the threads is the Worker's own: the claim (leases, attempts, rescue of
expired leases, paused queues, handler caps, registered names only), what a
claimed job meets before it runs (completed keys, exhausted attempts), payload
validation, atomic handlers, timeouts, and every settle. No executor, event loop
or listener thread is started: their connections would not see the rows of a
transaction that never commits (a ``TestCase``).

Inside the caller's transaction each handler and each settle statement runs in a
savepoint, so that a statement the database refuses fails the
attempt or is recorded by the worker, and the caller's transaction goes on.

``django_jobs.testing.drain()`` is its one caller; it touches nothing else of
the worker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, NamedTuple

from asgiref.sync import async_to_sync
from django.db import connections, transaction

from django_jobs import registry
from django_jobs.lifecycle import Failed
from django_jobs.rows import ClaimedJob
from django_jobs.store import JobStore
from django_jobs.worker.dispatcher import Worker
from django_jobs.worker.eventloop import attempt_in_task
from django_jobs.worker.executor import close_connections, tidy_connections
from django_jobs.worker.runs import ChunkRun, Finished, Run

__all__ = ["InlineWorker", "Reported"]


class Reported(NamedTuple):
    """One attempt a round ran (or settled without running), and how it ended."""

    job: ClaimedJob
    outcome: str  # "succeeded", "retried", "dead" or "snoozed"
    error: Any  # what the handler raised (retried, dead), else None


class InlineWorker(Worker):
    """The worker, driven from the caller's thread: claim, run each job here, settle at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # Async handlers run here too, one after the other, each awaited in a task on
        # a loop of its own (async_to_sync), its ORM calls on this thread: the outcome
        # is decided as on the worker's loop, and a timeout cancels the task.
        self._eventloop = self._timeouts.eventloop = None
        self._slots.loop_enabled = False
        self._slots.split(self.names, registry.all_handlers())
        self.claimed_last = 0  # how many jobs the last round claimed
        self._report: list[Reported] = []

    def round(self, limit: int, *, raise_errors: bool = False) -> list[Reported]:
        """Claim up to limit due jobs, run them one by one in claim order, settle each.

        `raise_errors`: when a handler raises, give its job back without counting
        the attempt and raise the exception here (a KeyboardInterrupt always is).
        RuntimeError if an outcome could not be settled (the worker's log says why).
        """
        self._report = []
        self.batch = self._slots.target = limit
        try:
            # Every round is a poll: every limited group and the other jobs (the worker's
            # state between polls would skip what the last round found too few of).
            self._look_everywhere()
            self.claimed_last, _ = self._claim()
            self._chunks.hand_out_due(time.monotonic(), everything=True)  # no waiting here
            while queued := self._executor.queued():
                for run in queued:
                    if isinstance(run, ChunkRun):
                        self._run_chunk_here(run, raise_errors)
                    else:
                        self._run_here(run, raise_errors)
            if self._settler.done:  # settled without running (their key's marker existed)
                self._settler.flush()
        finally:
            self._give_back()
        if self._settler.unsettled:
            raise RuntimeError(
                f"drain(): {len(self._settler.unsettled)} outcome(s) could not be settled "
                "(see the django_jobs.worker log)"
            )
        return self._report

    def _run_here(self, run: Run, raise_errors: bool) -> None:
        if run.handler is not None and run.handler.is_async:
            self._await_here(run, raise_errors)
            return
        timer = _Deadline(run) if run.timeout else None
        try:
            with _shielded():
                own = [] if _in_transaction() else list(connections.all(initialized_only=True))
                finished = self._executor.execute(run, own)
        finally:
            if timer is not None:
                timer.cancel()
        self._after(finished, raise_errors)

    def _await_here(self, run: Run, raise_errors: bool) -> None:
        with _shielded():
            own = [] if _in_transaction() else list(connections.all(initialized_only=True))
            finished = async_to_sync(_in_task)(run, self.id)
            try:
                tidy_connections(own)
            except BaseException:  # noqa: BLE001 - a handler can leave a connection in any state
                close_connections(own)
        self._after(finished, raise_errors)

    def _run_chunk_here(self, chunk: ChunkRun, raise_errors: bool) -> None:
        with _shielded():
            own = [] if _in_transaction() else list(connections.all(initialized_only=True))
            reports = self._executor.execute_chunk(chunk, own)
        for finished in reports:
            self._after(finished, raise_errors, flush=False)
        if self._settler.done:  # the chunk's successes in one statement, as in the worker
            self._settler.flush()

    def _after(self, finished: Finished, raise_errors: bool, *, flush: bool = True) -> None:
        """Settle a run's report as the dispatcher does (or raise what its handler raised)."""
        run = finished.run
        self._drain_inbox(0)  # what the handler asked for meanwhile (ctx.extend_lease)
        outcome = finished.outcome
        if isinstance(outcome, Failed) and not run.abandoned:
            # The worker records any BaseException as a failed attempt; a caller stops on
            # Ctrl-C, and with raise_errors on the handler's exception.
            exc = outcome.exc  # always set by the executor
            if exc is not None and (raise_errors or isinstance(exc, KeyboardInterrupt)):
                self._forget(run)
                self._release([run])
                raise exc
        if run.timed_out:
            # As the dispatcher does at the deadline: fail the attempt with TimeoutError,
            # which the handler's return (below) settles. (The timer started a moment
            # before the handler did: pass the deadline itself.)
            self._timeouts.expire(max(time.monotonic(), run.deadline or 0.0))
        self._on_finished(finished)
        if flush and self._settler.done:
            self._settler.flush()

    def _give_back(self) -> None:
        """Release whatever this round claimed but did not settle (after an error)."""
        left = [run for run in self._inflight if not run.abandoned] + list(self._held_back)
        self._executor.queued()
        self._inflight.clear()
        self._timeouts.timed.clear()
        self._held_back.clear()
        self._by_name.clear()
        self._chunks.reset()
        if left:
            self._release(left)

    def _db(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        # Each settle statement in a savepoint: one the database refuses (a trigger, a
        # constraint) is recorded by the worker, and the caller's transaction goes on.
        with _shielded():
            return super()._db(operation, settle=settle)

    def _pause(self, seconds: float) -> None:
        """Do not sleep after a database error inline: the error is reported instead."""

    def reported(self, job: ClaimedJob, outcome: str, error: Any, duration: float | None) -> None:
        self._report.append(Reported(job, outcome, error))
        super().reported(job, outcome, error, duration)


class _Deadline:
    """Do to a run at its timeout what the worker's dispatcher does: abandon it, cancel ctx."""

    def __init__(self, run: Run) -> None:
        self._timer = threading.Timer(run.timeout or 0.0, self.expire, args=(run,))
        self._timer.daemon = True
        self._timer.start()

    @staticmethod
    def expire(run: Run) -> None:
        run.abandoned = run.timed_out = True
        if run.ctx is not None:
            run.ctx.cancel()

    def cancel(self) -> None:
        self._timer.cancel()


async def _in_task(run: Run, worker_id: str) -> Finished:
    """Await run's async handler in a task; at its timeout, cancel the task as the loop does."""
    task = asyncio.ensure_future(attempt_in_task(run, worker_id))
    run.task = task  # kept after it ends: Timeouts words its warning for a cancelled task
    timer = None
    if run.timeout:
        timer = asyncio.get_running_loop().call_later(run.timeout, _cancel_at_timeout, run)
    try:
        return await task
    finally:
        if timer is not None:
            timer.cancel()


def _cancel_at_timeout(run: Run) -> None:
    _Deadline.expire(run)
    if run.task is not None:
        run.task.cancel()


def _in_transaction() -> bool:
    return any(conn.in_atomic_block for conn in connections.all(initialized_only=True))


@contextmanager
def _shielded() -> Iterator[None]:
    """Keep a database error inside from breaking the caller's transaction.

    Outside a transaction what runs inside runs as in the worker (autocommit).
    Inside one (a TestCase) it runs in a savepoint per connection, released
    afterwards, or rolled back when it left the transaction unusable (a failed
    statement aborts a PostgreSQL transaction).
    """
    with ExitStack() as stack:
        inside = [c for c in connections.all(initialized_only=True) if c.in_atomic_block]
        for conn in inside:
            stack.enter_context(transaction.atomic(using=conn.alias))
        yield
        for conn in inside:
            if JobStore(conn.alias).transaction_aborted():
                transaction.set_rollback(True, using=conn.alias)
