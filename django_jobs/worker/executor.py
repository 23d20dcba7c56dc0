"""The executor threads: each takes runs off the work queue, runs the handler, reports back.

A thread never raises and never settles: whatever happens in a handler becomes
an outcome (django_jobs.lifecycle) put on the dispatcher's inbox. Each thread
has its own connections, opened only if the handler touches the database, and
kept across jobs. A thread cannot be killed: one whose handler outlives its
timeout is abandoned by the dispatcher but not replaced, and takes the next run
once the handler returns (so threads and connections stay within concurrency + 2).
"""

from __future__ import annotations

import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from django_jobs import lifecycle, tracing
from django_jobs.store import JobStore
from django_jobs.worker import attempt
from django_jobs.worker.runs import STOP_EXECUTOR, ChunkRun, Finished, Run

# A thread idle longer than this checks its connection before the next handler
# (servers and poolers drop idle sessions; a failed first query would cost an attempt).
IDLE_CHECK = 5.0


class ThreadExecutor:
    """Run sync handlers on `size` threads; report each run on the dispatcher's inbox.

    One of the worker's two executors (the event loop is the other,
    django_jobs.worker.eventloop), behind the same small interface: submit,
    drain, cancel, shutdown. ``execute`` runs one job on the calling thread
    (the test helpers' drain() calls it).
    """

    def __init__(
        self,
        *,
        size: int,
        worker_id: str,
        database: str,
        store: JobStore,
        report: Callable[[Finished], None],
    ) -> None:
        self.size = size
        self._worker_id = worker_id
        self._database = database
        self._store = store
        self._report = report
        self._work: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._draining = False  # queued runs are handed back instead of started
        # Threads still running a handler abandoned past its timeout: not waited for
        # at shutdown (django_jobs.worker.timeouts adds and removes them).
        self.stuck: set[threading.Thread] = set()

    def start(self) -> None:
        for number in range(self.size):
            thread = threading.Thread(
                target=self._execute_loop, name=f"django-jobs-executor-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def threads(self) -> list[threading.Thread]:
        """The executor threads started."""
        return list(self._threads)

    def submit(self, run: Run | ChunkRun) -> None:
        """Queue run for the threads."""
        self._work.put(run)

    def queued(self) -> list[Run | ChunkRun]:
        """Take the runs queued and not started (for a caller that runs them itself)."""
        taken = []
        while not self._work.empty():
            item = self._work.get_nowait()
            if item is not STOP_EXECUTOR:
                taken.append(item)
        return taken

    def drain(self) -> None:
        """Hand back the queued runs unstarted from now on."""
        self._draining = True

    def cancel(self, run: Run) -> None:
        """A thread cannot be stopped: ctx.cancelled (set by the dispatcher) asks the handler."""

    def shutdown(self, timeout: float) -> None:
        """Stop the threads; wait at most timeout for those not stuck in a handler."""
        for _ in self._threads:
            self._work.put(STOP_EXECUTOR)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread in self.stuck:
                continue  # its handler outlived its timeout: it ends with the process
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _execute_loop(self) -> None:
        last_job = time.monotonic()
        # This thread's connection wrappers, looked up once: they live as long as the thread.
        own = [connections[alias] for alias in connections]
        try:
            while True:
                run = self._work.get()
                if run is STOP_EXECUTOR:
                    return
                if type(run) is ChunkRun:
                    self._chunk(run, own, last_job)
                    last_job = time.monotonic()
                    continue
                if self._draining:
                    self._report(Finished(run, lifecycle.Unstarted(), 0.0))
                    continue
                if time.monotonic() - last_job > IDLE_CHECK:
                    _check_connections(own)
                # Every run taken from the queue is reported, whatever happens in it:
                # a run stays in flight (and its lease extended) only until then.
                self._report(self.execute(run, own))
                last_job = time.monotonic()
        finally:
            connections.close_all()

    def execute(self, run: Run, own: list[Any]) -> Finished:
        """Run one job on this thread and return its report; it never raises.

        `own` are the connections to tidy after the handler (this thread's).
        """
        run.thread = threading.current_thread()
        run.started = time.monotonic()
        try:
            # In its span, when tracing is on.
            outcome = tracing.attempt(
                lambda r: attempt.outcome_of(r, self._worker_id, self._store, self._database), run
            )
        except BaseException as exc:  # noqa: BLE001 - outcome_of catches all; this is the net
            outcome = attempt.failure(run.job, exc, self._worker_id)
        if run.ctx is not None:
            run.ctx.flush_progress()  # its last value, written before the settle (same inbox)
        try:
            tidy_connections(own)
        except BaseException:  # noqa: BLE001 - a handler can leave a connection in any state
            close_connections(own)
        return Finished(run, outcome, time.monotonic() - run.started)

    def _chunk(self, chunk: ChunkRun, own: list[Any], last_job: float) -> None:
        """Run a chunk (or hand it back unstarted while draining); report each of its jobs."""
        if self._draining:
            for run in chunk.runs:
                self._report(Finished(run, lifecycle.Unstarted(), 0.0))
            return
        if time.monotonic() - last_job > IDLE_CHECK:
            _check_connections(own)
        for finished in self.execute_chunk(chunk, own):
            self._report(finished)

    def execute_chunk(self, chunk: ChunkRun, own: list[Any]) -> list[Finished]:
        """Run a chunk handler once over its jobs on this thread; return each job's report."""
        started = time.monotonic()
        thread = threading.current_thread()
        for run in chunk.runs:
            run.thread, run.started = thread, started
        try:
            outcomes = attempt.chunk_outcomes(chunk, self._worker_id, self._store, self._database)
        except BaseException as exc:  # noqa: BLE001 - chunk_outcomes catches all; the net
            outcomes = [attempt.failure(run.job, exc, self._worker_id) for run in chunk.runs]
        for run in chunk.runs:
            if run.ctx is not None:
                run.ctx.flush_progress()
        try:
            tidy_connections(own)
        except BaseException:  # noqa: BLE001 - a handler can leave a connection in any state
            close_connections(own)
        took = time.monotonic() - started
        return [
            Finished(run, outcome, took) for run, outcome in zip(chunk.runs, outcomes, strict=True)
        ]


def tidy_connections(own: list[Any]) -> None:
    """After a handler: roll back what it left open; drop broken connections; keep the rest.

    Unlike close_old_connections() this keeps healthy connections whatever
    CONN_MAX_AGE says: reconnecting for every job costs more than the job.
    """
    for conn in own:
        if conn.connection is None:
            continue
        try:
            if not conn.in_atomic_block and not conn.get_autocommit():
                conn.rollback()
                conn.set_autocommit(True)
            if conn.errors_occurred:
                if not conn.is_usable():
                    conn.close()
                conn.errors_occurred = False
        except DatabaseError:
            close_quietly(conn)
        conn.queries_log.clear()


def _check_connections(own: list[Any]) -> None:
    """Close connections that went bad while idle, so the next handler gets a fresh one."""
    for conn in own:
        if conn.connection is not None and not conn.is_usable():
            close_quietly(conn)


def close_connections(conns: list[Any]) -> None:
    """Close every connection of conns, whatever state the handler left it in."""
    for conn in conns:
        close_quietly(conn)


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except DatabaseError:
        pass
