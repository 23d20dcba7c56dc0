"""What the dispatcher and its threads pass each other: runs, inbox events, counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_jobs.context import JobContext
from django_jobs.lifecycle import Outcome
from django_jobs.limits import counted, format_duration
from django_jobs.registry import Handler
from django_jobs.rows import ClaimedJob


@dataclass(slots=True, eq=False)
class Run:
    """A claimed job on its way through the worker (hashed by identity)."""

    job: ClaimedJob
    handler: Handler | None  # None: settled without running
    ctx: JobContext | None
    timeout: float | None = None
    started: float = 0.0  # set by the executor thread when the handler starts
    abandoned: bool = False  # timed out or released: whatever it reports is ignored
    timed_out: bool = False
    thread: Any = None  # the executor thread running it (set when the handler starts)
    cancel_requested: bool = False  # an operator cancelled it: if it stops, it is dead-lettered
    on_loop: bool = False  # an async handler run as a task on the worker's event loop
    task: Any = None  # its asyncio task (set on the loop when it starts)
    # Seconds its timeout does not count: time the loop was blocked by another handler.
    excused: float = 0.0

    @property
    def deadline(self) -> float | None:
        if self.started and self.timeout:
            return self.started + self.timeout + self.excused
        return None


@dataclass(slots=True, eq=False)
class ChunkRun:
    """The runs of one chunk handler's jobs, run together by one call (worker/chunks.py)."""

    handler: Handler
    runs: list[Run]


# ---- inbox events ---------------------------------------------------------


@dataclass(slots=True)
class Finished:
    run: Run
    outcome: Outcome
    duration: float


@dataclass(slots=True)
class Wake:
    queue: str | None  # None: any queue


@dataclass(slots=True)
class Extend:
    run: Run
    seconds: float


@dataclass(slots=True)
class Progress:
    """A handler's ctx.progress() value, for the dispatcher to write to its job's row."""

    run: Run
    value: dict[str, Any]


@dataclass(slots=True)
class Stop:
    pass


STOP_EXECUTOR = object()


class HandlersStuck(RuntimeError):
    """Every executor thread of the worker runs a handler abandoned past its timeout.

    Worker.run() raises it once it has stopped claiming, recorded those attempts
    as timed out and released the jobs it had not started: only a new process
    frees the threads (runjobs exits with EXIT_STUCK for a supervisor to restart it).
    """


class DatabaseAway(RuntimeError):
    """A burst worker's database failed every statement for BURST_PATIENCE seconds.

    A serving worker waits for its database as long as it takes; one in burst mode
    (a cron job, a CI step) gives up instead of hanging: Worker.run() raises this once
    it has stopped, its unsettled jobs left to the rescue of expired leases.
    """


# How long a burst worker waits for a database that fails every statement (seconds).
BURST_PATIENCE = 30.0


# runjobs' exit code when its threads are all stuck in abandoned handlers (docs/worker.md).
EXIT_STUCK = 3


def traceback_tail(error: dict[str, Any]) -> str:
    """The stored traceback of an error entry, as a log line's tail."""
    text = error.get("traceback")
    return f"\n{text}" if text else ""


@dataclass
class WorkerStats:
    """A worker's counters since it started (published in its heartbeat row)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lost: int = 0  # this worker's late settles fenced out: another worker took the job over
    reexecuted: int = 0  # jobs this worker took over after a lease expired: they may run twice
    skipped: int = 0  # settled as done without running: the key's marker existed
    snoozed: int = 0
    cancelled: int = 0
    # Not a counter: handlers running now past their timeout, each holding its job,
    # its slots and its thread until it returns (shown by `jobs status`).
    abandoned: int = 0

    def summary(self) -> str:
        """The counts of a worker's "stopped" log line."""
        # The rare counts only when they happened: "0 late settles fenced out" on every
        # stop is jargon a first run does not need.
        rare = counted(
            (self.released, "released"),
            (self.reexecuted, "re-executed after an expired lease"),
            (self.lost, "late settles fenced out"),
            (self.skipped, "skipped"),
        )
        common = f"{self.succeeded} succeeded, {self.retried} retried, {self.dead} dead"
        return ", ".join([common, *rare])


# A log line names at most this many jobs, then counts the rest.
MAX_NAMED_IN_LOG = 10


def named_runs(runs: list[Run], now: float) -> str:
    """Name runs in a log line: each job, and how long it has run (the first ten)."""
    shown = runs[:MAX_NAMED_IN_LOG]
    named = "; ".join(
        f"job {run.job.id} ({run.job.name}"
        + (f", running {format_duration(now - run.started)}" if run.started else ", not started")
        + ")"
        for run in shown
    )
    more = len(runs) - len(shown)
    return named + (f"; and {more} more" if more else "")


def log_extra(job: ClaimedJob) -> dict[str, Any]:
    """Return the stable `extra` keys of a job's log records."""
    return {
        "job_id": str(job.id),
        "job_name": job.name,
        "queue": job.queue,
        "attempt": job.attempts,
    }
