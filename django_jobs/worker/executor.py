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

from django_jobs import lifecycle
from django_jobs.lifecycle import Outcome
from django_jobs.models import ClaimedJob, JobQuerySet
from django_jobs.worker import attempt
from django_jobs.worker.runs import STOP_EXECUTOR, Finished, Run

# A thread idle longer than this checks its connection before the next handler
# (servers and poolers drop idle sessions; a failed first query would cost an attempt).
IDLE_CHECK = 5.0


class ExecutorThreads:
    """The executor side of Worker (a mixin).

    It uses only: database, id, _queryset (complete_atomically), _work (runs to
    take), _inbox (reports to put), _draining, _closing, _threads and _stuck_threads
    (threads still running an abandoned handler, not waited for at shutdown).
    """

    database: str
    id: str
    _queryset: JobQuerySet
    _work: queue_module.SimpleQueue[Any]
    _inbox: queue_module.SimpleQueue[Any]
    _draining: bool
    _closing: threading.Event
    _threads: list[threading.Thread]
    _stuck_threads: set[threading.Thread]

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_executor(self) -> None:
        self._start_thread(self._execute_loop, f"django-jobs-executor-{len(self._threads)}")

    def _shutdown_threads(self) -> None:
        self._closing.set()
        for _ in self._threads:
            self._work.put(STOP_EXECUTOR)
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            if thread in self._stuck_threads:
                continue  # its handler outlived its timeout: it ends with the process
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        connections[self.database].close()

    def _execute_loop(self) -> None:
        last_job = time.monotonic()
        # This thread's connection wrappers, looked up once: they live as long as the thread.
        own = [connections[alias] for alias in connections]
        try:
            while True:
                run = self._work.get()
                if run is STOP_EXECUTOR:
                    return
                if self._draining:
                    self._inbox.put(Finished(run, lifecycle.Unstarted(), 0.0))
                    continue
                if time.monotonic() - last_job > IDLE_CHECK:
                    _check_connections(own)
                # Every run taken from the queue is reported, whatever happens in it:
                # a run stays in flight (and its lease extended) only until then.
                self._inbox.put(self._execute(run, own))
                last_job = time.monotonic()
        finally:
            connections.close_all()

    def _execute(self, run: Run, own: list[Any]) -> Finished:
        """Run one job on this thread and return its report; it never raises."""
        run.thread = threading.current_thread()
        run.started = time.monotonic()
        try:
            outcome = self.outcome_of(run)
        except BaseException as exc:  # noqa: BLE001 - outcome_of catches all; this is the net
            outcome = self._failure(run.job, exc)
        try:
            tidy_connections(own)
        except BaseException:  # noqa: BLE001 - a handler can leave a connection in any state
            close_connections(own)
        return Finished(run, outcome, time.monotonic() - run.started)

    def outcome_of(self, run: Run) -> Outcome:
        """Run a claimed job's handler on this thread and return what happened (never raises)."""
        return attempt.outcome_of(run, self.id, self._queryset, self.database)

    def _failure(
        self, job: ClaimedJob, exc: BaseException, fatal: bool = False
    ) -> lifecycle.Failed:
        return attempt.failure(job, exc, self.id, fatal)


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
            _close_quietly(conn)
        conn.queries_log.clear()


def _check_connections(own: list[Any]) -> None:
    """Close connections that went bad while idle, so the next handler gets a fresh one."""
    for conn in own:
        if conn.connection is not None and not conn.is_usable():
            _close_quietly(conn)


def close_connections(conns: list[Any]) -> None:
    """Close every connection of conns, whatever state the handler left it in."""
    for conn in conns:
        _close_quietly(conn)


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except DatabaseError:
        pass
