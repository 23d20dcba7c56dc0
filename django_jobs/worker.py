"""The worker: claims due jobs, runs their handlers on threads, settles the outcomes.

One dispatcher loop (the thread that calls ``Worker.run``) owns one database
connection and does every claim, settle and heartbeat; ``concurrency`` executor
threads run handlers (each with its own connection, opened only if the handler
touches the database); on PostgreSQL one listener thread waits for NOTIFY
wake-ups. A worker therefore holds at most concurrency + 2 connections.

Guarantees, in the order a job meets them:

- a claim leases jobs to a token and counts an attempt each, so a job that kills
  its worker every time still ends in the dead letters after max attempts;
- leases are extended while jobs are held (heartbeat) and every settle is fenced
  on the token: a worker whose lease was taken over changes nothing;
- a job whose completion marker exists is settled as done without running;
- successes are settled in batches (delete + marker in one statement); atomic
  handlers commit their marker with their own effects instead;
- failures retry with the handler's backoff, then dead-letter.

Throughput comes from keeping the executors busy while the dispatcher waits on
the database: claimed jobs go straight onto the executors' queue (up to the
concurrency plus a short look-ahead sized from how long jobs take), and
successes are settled together every few milliseconds.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue as queue_module
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from django_jobs import conf, lifecycle, limits, payloads, registry, signals
from django_jobs.attempts import (
    MAX_MESSAGE,
    error_entry,
    error_summary,
    lease_token,
    type_name,
)
from django_jobs.context import JobContext
from django_jobs.exceptions import FatalError, JobCancelled, LeaseLost, Snooze
from django_jobs.maintenance import WorkerOps
from django_jobs.models import ClaimedJob, Job, JobQuerySet
from django_jobs.payloads import safe_str, storable_text
from django_jobs.registry import Backoff, Handler

logger = logging.getLogger(__name__)

# Successes wait at most this long (or for a full batch) before being settled together.
FLUSH_INTERVAL = 0.01
# How much work to queue beyond free threads: enough to keep them busy this long.
LOOKAHEAD = 0.02
# A thread idle longer than this checks its connection before the next handler
# (servers and poolers drop idle sessions; a failed first query would cost an attempt).
IDLE_CHECK = 5.0
# How often the listener looks up from its socket to see whether the worker is stopping.
LISTEN_TIMEOUT = 0.25
# Reconnection backoff after database errors.
RETRY_MIN, RETRY_MAX = 0.1, 5.0

_DB_ERRORS = (OperationalError, InterfaceError)


def _extra(job: ClaimedJob) -> dict[str, Any]:
    return {
        "job_id": str(job.id),
        "job_name": job.name,
        "queue": job.queue,
        "attempt": job.attempts,
    }


# ---- outcomes an executor reports (see django_jobs.lifecycle) -----------------

_Succeeded = lifecycle.Succeeded
_Failed = lifecycle.Failed
Outcome = lifecycle.Outcome


class _DefaultPolicy:
    """The policy of a job settled without its handler (the settings' backoff)."""

    def get_backoff(self) -> Backoff:
        return Backoff.coerce(conf.get("BACKOFF"))


_DEFAULT_POLICY = _DefaultPolicy()


@dataclass(slots=True)
class _DbRefused:
    """The database refused a settle's statement (not a connection error): exc says why."""

    exc: Exception


@dataclass(slots=True, eq=False)
class _Run:
    """A claimed job on its way through the worker (hashed by identity)."""

    job: ClaimedJob
    handler: Handler | None  # None: settled without running
    ctx: JobContext | None
    timeout: float | None = None
    started: float = 0.0  # set by the executor thread when the handler starts
    abandoned: bool = False  # timed out or released: whatever it reports is ignored
    timed_out: bool = False
    cancel_requested: bool = False  # an operator cancelled it: if it stops, it is dead-lettered

    @property
    def deadline(self) -> float | None:
        return self.started + self.timeout if self.started and self.timeout else None


# ---- inbox events ---------------------------------------------------------


@dataclass(slots=True)
class _Finished:
    run: _Run
    outcome: Outcome
    duration: float


@dataclass(slots=True)
class _Wake:
    queue: str | None  # None: any queue


@dataclass(slots=True)
class _Extend:
    run: _Run
    seconds: float


@dataclass(slots=True)
class _Stop:
    pass


_STOP_EXECUTOR = object()
_FENCED = object()  # a settle found the row leased to another worker


def _traceback_of(error: dict[str, Any]) -> str:
    """The stored traceback of an error entry, as a log line's tail."""
    text = error.get("traceback")
    return f"\n{text}" if text else ""


@dataclass
class WorkerStats:
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


@dataclass
class Worker:
    """Run jobs until stopped (or, in burst mode, until nothing is due)."""

    queues: list[str] | None = None
    concurrency: int | None = None
    batch: int | None = None
    lease: float | None = None
    heartbeat: float | None = None
    grace: float | None = None
    poll_interval: float | None = None
    listen: bool | None = None
    burst: bool = False
    max_jobs: int | None = None
    database: str | None = None
    stats: WorkerStats = field(default_factory=WorkerStats)

    def __post_init__(self) -> None:
        settings = conf.get_settings()
        self.database = self.database or settings["DATABASE"]
        try:  # before any SQL: a lease of 1e13 s would fail every claim
            self._check_options(settings)
        except ValueError as exc:
            raise ImproperlyConfigured(f"Worker: {exc}") from None
        if self.listen is None:
            self.listen = bool(settings["LISTEN"])
        self.listen = self.listen and connections[self.database].vendor == "postgresql"
        if not self.queues:
            self.queues = sorted(registry.declared_queues())
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._claims = itertools.count(1)
        self._inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        self._work: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        # Runs handed to the executors (queued or running), and those a per-handler cap holds back.
        self._inflight: set[_Run] = set()
        self._held_back: deque[_Run] = deque()
        self._by_name: dict[str, int] = {}
        self._timed: set[_Run] = set()  # in-flight runs that have a timeout
        self._done: list[tuple[_Run, str | None, float]] = []
        self._done_since = 0.0
        self._unsettled: list[tuple[_Run, Outcome, float]] = []  # settles that hit a DB error
        self._next_unsettled_retry = 0.0
        self._to_release: list[_Run] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._draining = False  # executors hand queued runs back instead of starting them
        self._closing = threading.Event()
        self._more = True  # jobs may be due: claim without waiting for the poll
        self._avg_duration: float | None = None
        self._target = self.concurrency  # in-flight jobs to aim for
        self._claimed_total = 0
        self._db_failures = 0
        self._queryset: JobQuerySet = Job.objects.using(self.database)
        self._timeouts: dict[str, float | None] = {}
        self._excluded: set[str] = set()  # capped handlers the last claim left out
        # The job names this worker claims (and publishes in its heartbeat row).
        self.names = sorted(registry.all_handlers())
        self._names_generation = registry.generation()
        self._ops = WorkerOps(self)  # heartbeat row, schedules, pruning, counters

    def _check_options(self, settings: dict[str, Any]) -> None:
        """Fill unset options from settings; raise ValueError for any outside django_jobs.limits."""
        self.concurrency = limits.integer(
            "concurrency", self.concurrency or settings["CONCURRENCY"], 1, limits.MAX_CONCURRENCY
        )
        self.batch = limits.integer("batch", self.batch or settings["BATCH"], 1, limits.MAX_INT)
        if self.max_jobs is not None:
            limits.integer("max_jobs", self.max_jobs, 1, limits.MAX_INT)
        self.lease = limits.seconds("lease", self.lease or settings["LEASE"])
        if self.heartbeat is None:
            self.heartbeat = settings["HEARTBEAT"]
        if self.heartbeat is None:
            self.heartbeat = self.lease / 3
        self.heartbeat = limits.seconds("heartbeat", self.heartbeat, zero=True)
        if self.heartbeat >= self.lease:
            raise ValueError(f"heartbeat ({self.heartbeat:g}s) must be shorter than the lease")
        grace = self.grace if self.grace is not None else settings["GRACE"]
        self.grace = limits.seconds("grace", grace, zero=True)
        poll = self.poll_interval or settings["POLL_INTERVAL"]
        self.poll_interval = limits.seconds("poll_interval", poll)
        for name in self.queues or ():
            registry.check_queue(name, allowlist=False)

    # ---- public -----------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let running jobs finish within the grace period, then return."""
        self._inbox.put(_Stop())

    def run(self) -> None:
        """Work until stopped (or, in burst mode, until nothing is due)."""
        logger.info(
            "worker %s starting: queues=%s concurrency=%d batch=%d lease=%.0fs",
            self.id, ",".join(self.queues), self.concurrency, self.batch, self.lease,
        )  # fmt: skip
        for _ in range(self.concurrency):
            self._start_executor()
        if self.listen and not self.burst:  # burst mode drains and leaves: nothing to wait for
            self._start_thread(self._listen, "django-jobs-listener")
        try:
            self._ops.start()
            self._loop()
        finally:
            self._ops.stopped()
            self._shutdown_threads()
        stats = self.stats
        logger.info(
            "worker %s stopped: %d succeeded, %d retried, %d dead, %d released, "
            "%d re-executed after an expired lease, %d late settles fenced out, %d skipped",
            self.id, stats.succeeded, stats.retried, stats.dead, stats.released,
            stats.reexecuted, stats.lost, stats.skipped,
        )  # fmt: skip

    # ---- the dispatcher loop ----------------------------------------------

    def _loop(self) -> None:
        now = time.monotonic()
        next_poll = now
        next_heartbeat = now + self.heartbeat if self.heartbeat else float("inf")
        grace_deadline: float | None = None
        while True:
            now = time.monotonic()
            self._drain_inbox(self._next_timeout(now, next_poll, next_heartbeat, grace_deadline))
            if self._stopping and grace_deadline is None:
                grace_deadline = self._begin_shutdown()
            now = time.monotonic()

            if self._timed:
                self._expire_timeouts(now)
            if self._to_release:
                self._release(self._to_release)
                self._to_release = []
            if self._done and (
                len(self._done) >= self.batch
                or now - self._done_since >= FLUSH_INTERVAL
                or self._stopping
                or not (self._inflight or self._more)
            ):
                self._flush_done()
            if self._unsettled and now >= self._next_unsettled_retry:
                self._retry_unsettled()
                self._next_unsettled_retry = now + 1.0

            if self._stopping:
                if not self._inflight or now >= grace_deadline:
                    self._finish_shutdown()
                    return
                continue

            self._ops.tick(now)
            if self._want_claim(now >= next_poll) or self._ops.beat_due(now):
                got, asked = self._claim()
                if asked:
                    self._more = got >= asked
                next_poll = time.monotonic() + self.poll_interval

            if self.heartbeat and now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.heartbeat
            self._clear_query_log()

            if self._finished_work():
                self._flush_done()
                if not self._unsettled:
                    return

    def _next_timeout(
        self, now: float, next_poll: float, next_heartbeat: float, grace_deadline: float | None
    ) -> float:
        if not self._stopping and self._want_claim(poll_due=False):
            return 0.0
        deadlines = [next_poll]
        if self._inflight or self._held_back:
            deadlines.append(next_heartbeat)
        if self._done:
            deadlines.append(self._done_since + FLUSH_INTERVAL)
        if self._unsettled:
            deadlines.append(self._next_unsettled_retry)
        if grace_deadline is not None:
            deadlines.append(grace_deadline)
        deadlines.extend(d for run in self._timed if (d := run.deadline))
        return max(0.0, min(deadlines) - now)

    def _drain_inbox(self, timeout: float) -> None:
        try:
            event = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue_module.Empty:
            return
        while True:
            self._handle(event)
            try:
                event = self._inbox.get_nowait()
            except queue_module.Empty:
                return

    def _handle(self, event: Any) -> None:
        if isinstance(event, _Finished):
            self._on_finished(event)
        elif isinstance(event, _Wake):
            if event.queue is None or event.queue in self.queues:
                self._more = True
        elif isinstance(event, _Extend):
            run = event.run
            if run in self._inflight and not run.abandoned:
                self._db(lambda: self._queryset.extend_leases([run.job], event.seconds))
        elif isinstance(event, _Stop):
            if not self._stopping:
                logger.info(
                    "worker %s stopping: finishing running jobs (grace %.0fs)", self.id, self.grace
                )
            self._stopping = True

    def _finished_work(self) -> bool:
        """In burst or max-jobs mode: True once there is nothing left to do."""
        if self._inflight or self._held_back or self._done or self._to_release:
            return False
        if self.max_jobs is not None and self._claimed_total >= self.max_jobs:
            return True
        return self.burst and not self._more

    # ---- claiming ---------------------------------------------------------

    def _free_slots(self) -> int:
        free = self._target - len(self._inflight) - len(self._held_back)
        if self.max_jobs is not None:
            free = min(free, self.max_jobs - self._claimed_total)
        return max(0, min(free, self.batch))

    def _want_claim(self, poll_due: bool) -> bool:
        if not (self._more or poll_due):
            return False
        free = self._free_slots()
        if free <= 0:
            return False
        # Claim at once when threads would idle; otherwise wait until half the
        # look-ahead is free rather than claiming a job at a time.
        return len(self._inflight) < self.concurrency or free >= self._target // 2

    def _claim(self) -> tuple[int, int]:
        asked = self._free_slots()
        seq = next(self._claims)
        token = lease_token(self.id, seq)
        capped = [
            name
            for name, count in self._by_name.items()
            if (h := registry.lookup(name)) and h.concurrency and count >= h.concurrency
        ]
        self._excluded = set(capped)
        if registry.generation() != self._names_generation:
            self._names_changed()
        beat = self._ops.beat(time.monotonic())
        # Rotate the queues so that a busy one does not always come first.
        first = seq % len(self.queues)
        queues = self.queues[first:] + self.queues[:first]
        jobs = self._db(
            lambda: self._queryset.claim(
                queues=queues,
                limit=asked,
                token=token,
                lease=self.lease,
                exclude_names=capped,
                beat=beat,
                names=self.names,
            )
        )
        if jobs is None:
            return asked, asked  # the database is away: try again, do not conclude "idle"
        self._claimed_total += len(jobs)
        self.stats.claimed += len(jobs)
        for job in jobs:
            self._accept(job)
        return len(jobs), asked

    def _names_changed(self) -> None:
        self._names_generation = registry.generation()
        self.names = sorted(registry.all_handlers())
        self._ops.names_changed()
        logger.info("worker %s: now claims %d job name(s)", self.id, len(self.names))

    def _accept(self, job: ClaimedJob) -> None:
        """Settle at once what must not run; hand the rest to the executors."""
        handler = registry.lookup(job.name) if type(job.name) is str else None
        transition = lifecycle.on_claim(job, has_handler=handler is not None)
        if getattr(transition, "retaken", False):
            self.stats.reexecuted += 1
            logger.warning(
                "job %s: attempt %d's lease expired (worker %s); taking it over as attempt %d",
                job.id, job.attempts - 1, job.errors[-1].get("worker", "?"), job.attempts,
                extra=_extra(job),
            )  # fmt: skip
        if isinstance(transition, lifecycle.Run):
            ctx = JobContext(
                id=job.id,
                name=job.name,
                queue=job.queue,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                enqueued_at=job.enqueued_at,
                dedupe_key=job.key,
                worker_id=self.id,
                started_at=job.started_at,
                errors=job.errors,
            )
            run = _Run(job, handler, ctx, timeout=self._timeout_of(handler))
            ctx._extend = lambda seconds: self._inbox.put(_Extend(run, seconds))
            self._hand_out(run)
        elif isinstance(transition, lifecycle.Complete):
            logger.info("job %s already completed (marker exists): settling without running",
                        job.id, extra=_extra(job))  # fmt: skip
            self._carry_out(_Run(job, None, None), transition, 0.0)
        elif isinstance(transition, lifecycle.Release):
            logger.warning("job %s: no handler %r in this worker any more: released",
                           job.id, job.name, extra=_extra(job))  # fmt: skip
            self._to_release.append(_Run(job, None, None))
            self._names_generation = -1  # claim by the registry's names from now on
        else:
            if transition.reason == lifecycle.MALFORMED:
                job.make_storable()
            self._carry_out(_Run(job, None, None), transition, 0.0)

    def _timeout_of(self, handler: Handler) -> float | None:
        try:
            return self._timeouts[handler.name]
        except KeyError:
            return self._timeouts.setdefault(handler.name, handler.get_timeout())

    def _hand_out(self, run: _Run) -> None:
        """Queue run for the executors, unless its handler's cap is reached."""
        name = run.job.name
        cap = run.handler.concurrency
        if cap and self._by_name.get(name, 0) >= cap:
            self._held_back.append(run)
            return
        self._inflight.add(run)
        self._ops.started()
        self._by_name[name] = self._by_name.get(name, 0) + 1
        if run.timeout:
            self._timed.add(run)
        self._work.put(run)

    def _release_held_back(self) -> None:
        waiting, self._held_back = self._held_back, deque()
        for run in waiting:
            self._hand_out(run)

    # ---- outcomes -----------------------------------------------------------

    def _on_finished(self, event: _Finished) -> None:
        run = event.run
        if run.abandoned:
            return
        self._forget(run)
        if type(event.outcome) is lifecycle.Unstarted:
            self._settle(run, event.outcome, 0.0)  # released, attempt not counted
            return
        duration = event.duration
        avg = self._avg_duration
        self._avg_duration = avg = duration if avg is None else 0.9 * avg + 0.1 * duration
        # Short jobs are queued ahead of free threads so that claims stay few;
        # long ones only as threads free up, so one worker does not hoard them.
        self._target = self.concurrency + min(
            self.batch, int(self.concurrency * LOOKAHEAD / max(avg, 1e-6))
        )
        self._settle(run, event.outcome, duration)

    def _forget(self, run: _Run) -> None:
        if run in self._inflight:
            self._inflight.discard(run)
            self._timed.discard(run)
            name = run.job.name
            left = self._by_name.get(name, 1) - 1
            if left:
                self._by_name[name] = left
            else:
                self._by_name.pop(name, None)
            if name in self._excluded:
                self._more = True  # the last claim skipped this capped handler's jobs
            if self._held_back and not self._stopping:
                self._release_held_back()

    def _settle(self, run: _Run, outcome: Outcome, duration: float) -> None:
        """Ask the lifecycle what outcome leads to, and carry it out."""
        if type(outcome) is _Succeeded:  # the hot path: no policy to look up
            transition: lifecycle.Transition = lifecycle.Complete(outcome.result)
        else:
            transition = lifecycle.on_outcome(
                run.job,
                outcome,
                policy=run.handler or _DEFAULT_POLICY,
                cancel_requested=run.cancel_requested,
            )
        self._carry_out(run, transition, duration, outcome)

    def _carry_out(
        self,
        run: _Run,
        transition: lifecycle.Transition,
        duration: float,
        outcome: Outcome | None = None,
    ) -> None:
        """Execute transition through the store; outcome is kept to settle again later."""
        job = run.job
        if isinstance(transition, lifecycle.Complete):
            if transition.skipped:
                self.stats.skipped += 1
                if isinstance(outcome, lifecycle.AlreadyDone):
                    logger.warning(
                        "job %s: its key was completed by another attempt; effects rolled back",
                        job.id, extra=_extra(job),
                    )  # fmt: skip
            if not self._done:
                self._done_since = time.monotonic()
            self._done.append((run, transition.result, duration))
        elif isinstance(transition, lifecycle.Retry):
            self._retry(run, transition, duration, outcome)
        elif isinstance(transition, lifecycle.DeadLetter):
            error = self._entry(transition.error, job)
            if transition.drop_last_error:
                job.errors = job.errors[:-1] if job.errors else []
            written = self._dead_letter(
                job, transition.reason, error, attempts=transition.attempts, exc=transition.exc
            )
            if written is None and outcome is not None:
                # (A letter decided at claim is not kept: the lease brings the job back.)
                self._unsettled.append((run, outcome, duration))
            elif written and transition.reason == lifecycle.CANCELLED:
                self.stats.cancelled += 1
        elif isinstance(transition, lifecycle.SnoozeFor):
            self._snooze(run, transition, duration, outcome)
        elif isinstance(transition, lifecycle.Completed):
            self.stats.succeeded += 1
            logger.debug("job %s succeeded (atomic)", job.id, extra=_extra(job))
            self._send_finished(job, "succeeded", None, duration)
        elif isinstance(transition, lifecycle.Abandon):
            self.stats.lost += 1
            logger.warning("job %s: lease lost to another worker; this attempt was rolled back",
                           job.id, extra=_extra(job))  # fmt: skip
        elif isinstance(transition, lifecycle.Release):
            self._to_release.append(run)
        elif isinstance(transition, lifecycle.Interrupt):
            run.ctx.cancel()
            logger.warning("job %s: cancellation requested; ctx.cancelled is set", job.id,
                           extra=_extra(job))  # fmt: skip

    def _entry(
        self, error: dict[str, Any] | lifecycle.Cause | BaseException, job: ClaimedJob
    ) -> dict[str, Any]:
        """Return the error entry a transition carries, described or written down."""
        if isinstance(error, dict):
            return error
        if isinstance(error, BaseException):
            return error_entry(job.attempts, exc=error, worker=self.id)
        return error_entry(
            error.attempt,
            kind=error.kind,
            message=error.message,
            traceback=error.traceback,
            worker=self.id if error.worker is None else error.worker,
        )

    def _snooze(
        self, run: _Run, transition: lifecycle.SnoozeFor, duration: float, outcome: Any
    ) -> None:
        job = run.job
        ok = self._db(lambda: self._queryset.snooze(job, delay=transition.seconds), settle=True)
        if ok is None:
            self._unsettled.append((run, outcome, duration))
        elif isinstance(ok, _DbRefused):
            self._settle(run, self._refused("snooze", job, ok.exc), duration)
        elif ok:
            self.stats.snoozed += 1
            if transition.seconds <= 0:
                self._more = True
            logger.info("job %s snoozed for %.1fs (attempt not counted)", job.id,
                        transition.seconds, extra=_extra(job))  # fmt: skip
            self._send_finished(job, "snoozed", None, duration)
        else:
            self._note_fenced(job)

    def _retry(self, run: _Run, transition: lifecycle.Retry, duration: float, outcome: Any) -> None:
        job = run.job
        delay, error = transition.delay, transition.error
        ok = self._db(lambda: self._queryset.retry(job, delay=delay, error=error), settle=True)
        if ok is None:
            self._unsettled.append((run, outcome, duration))
        elif isinstance(ok, _DbRefused):
            refused = lifecycle.Refused(
                "retry", error_entry(job.attempts, exc=ok.exc, worker=self.id), original=error,
                exc=transition.exc,
            )  # fmt: skip
            self._settle(run, refused, duration)
        elif ok:
            self.stats.retried += 1
            if delay <= 0:
                self._more = True
            logger.warning(
                "job %s attempt %d/%d failed (%s); retrying in %.1fs%s",
                job.id, job.attempts, job.max_attempts, error_summary(error), delay,
                _traceback_of(error) if logger.isEnabledFor(logging.DEBUG) else "",
                extra=_extra(job),
            )  # fmt: skip
            self._send_finished(job, "retried", transition.exc, duration)
        else:
            self._note_fenced(job)

    def _refused(self, step: str, job: ClaimedJob, exc: Exception) -> lifecycle.Refused:
        return lifecycle.Refused(step, error_entry(job.attempts, exc=exc, worker=self.id), exc=exc)

    def _dead_letter(
        self,
        job: ClaimedJob,
        reason: str,
        error: dict[str, Any],
        *,
        attempts: int | None = None,
        exc: BaseException | None = None,
    ) -> bool | None:
        """Move job to the dead letters: True if written, None to try again (database away)."""
        letter = self._db(
            lambda: (
                self._queryset.dead_letter(job, reason=reason, error=error, attempts=attempts)
                or _FENCED
            ),
            settle=True,
        )
        if letter is None:
            return None
        if letter is _FENCED:
            return False  # another worker holds it now: whoever settles it decides
        if isinstance(letter, _DbRefused):
            # lifecycle: Abandon. Nothing this worker writes for the job is taken.
            logger.error("job %s: its dead letter (%s) could not be written", job.id, reason,
                         extra=_extra(job))  # fmt: skip
            return False
        self.stats.dead += 1
        # The stored (capped, storable) traceback, not exc_info: a 10 MB message
        # must not make a 10 MB log line, and a hostile exception cannot break logging.
        logger.error(
            "job %s dead-lettered (%s) after %d attempt(s): %s%s",
            job.id, reason, letter.attempts, error_summary(error), _traceback_of(error),
            extra=_extra(job),
        )  # fmt: skip
        if signals.job_dead_lettered.receivers:
            self._signal(
                signals.job_dead_lettered,
                sender=job.name, job_id=job.id, name=job.name, queue=job.queue,
                reason=reason, attempts=letter.attempts, error=letter.error,
            )  # fmt: skip
        self._send_finished(job, "dead", exc, None)
        return True

    def _flush_done(self) -> None:
        batch, self._done = self._done, []
        settled = self._db(
            lambda: self._queryset.complete(
                [(run.job.id, run.job.token, result) for run, result, _ in batch]
            ),
            settle=True,
        )
        if settled is None:
            # The database is away: settle one by one once it is back.
            self._unsettled.extend((run, _Succeeded(result), d) for run, result, d in batch)
        elif isinstance(settled, _DbRefused):
            if len(batch) == 1:
                run, _, duration = batch[0]
                self._settle(run, self._refused("complete", run.job, settled.exc), duration)
                return
            # One row the database refuses must not fail the others: settle each alone.
            for run, result, duration in batch:
                self._complete_one(run, result, duration)
        else:
            for index, (run, _, duration) in enumerate(batch):
                if index in settled:
                    self._succeeded(run.job, duration)
                else:
                    self._note_fenced(run.job)

    def _complete_one(self, run: _Run, result: str | None, duration: float) -> None:
        job = run.job
        settled = self._db(
            lambda: self._queryset.complete([(job.id, job.token, result)]), settle=True
        )
        if settled is None:
            self._unsettled.append((run, _Succeeded(result), duration))
        elif isinstance(settled, _DbRefused):
            self._settle(run, self._refused("complete", job, settled.exc), duration)
        elif settled:
            self._succeeded(job, duration)
        else:
            self._note_fenced(job)

    def _succeeded(self, job: ClaimedJob, duration: float) -> None:
        self.stats.succeeded += 1
        self._send_finished(job, "succeeded", None, duration)

    def _retry_unsettled(self) -> None:
        pending, self._unsettled = self._unsettled, []
        for run, outcome, duration in pending:
            if isinstance(outcome, _Succeeded):
                self._complete_one(run, outcome.result, duration)
            else:
                self._settle(run, outcome, duration)

    def _note_fenced(self, job: ClaimedJob) -> None:
        self.stats.lost += 1
        logger.warning(
            "job %s: lease was taken over before this worker settled it; "
            "its late result is dropped",
            job.id, extra=_extra(job),
        )  # fmt: skip

    def _send_finished(
        self, job: ClaimedJob, outcome: str, error: Any, duration: float | None
    ) -> None:
        self._ops.finished(outcome, duration)
        # One line per outcome at runjobs' default verbosity (-v 1), as Celery and procrastinate.
        if logger.isEnabledFor(logging.INFO):
            extra = _extra(job)
            extra["outcome"], extra["duration"] = outcome, duration
            if duration is None:
                logger.info("job %s[%s] attempt %d %s", job.name, job.id, job.attempts, outcome,
                            extra=extra)  # fmt: skip
            else:
                logger.info("job %s[%s] attempt %d %s in %.6fs", job.name, job.id, job.attempts,
                            outcome, duration, extra=extra)  # fmt: skip
        if signals.job_finished.receivers:
            self._signal(
                signals.job_finished,
                sender=job.name, job_id=job.id, name=job.name, queue=job.queue,
                attempt=job.attempts, outcome=outcome, error=error, duration=duration,
            )  # fmt: skip

    def _signal(self, signal: Any, **kwargs: Any) -> None:
        """Send signal from the dispatcher: a failing receiver is logged, not fatal."""
        for receiver, response in signal.send_robust(**kwargs):
            if isinstance(response, Exception):
                logger.error(
                    "worker %s: a receiver of a django_jobs signal (%s) raised %s: %s",
                    self.id, safe_str(receiver), type_name(response),
                    storable_text(safe_str(response), MAX_MESSAGE),
                )  # fmt: skip

    # ---- leases, timeouts and shutdown --------------------------------------

    def _heartbeat(self) -> None:
        held = [run for run in self._inflight if not run.abandoned] + list(self._held_back)
        if not held:
            return
        kept = self._db(lambda: self._queryset.extend_leases([run.job for run in held], self.lease))
        if kept is None:
            return
        for run in held:
            cancel = kept.get(run.job.id)
            if cancel is None:
                if run.ctx is not None:
                    run.ctx.cancel()
                logger.warning("job %s: lease lost (another worker took it over)", run.job.id,
                               extra=_extra(run.job))  # fmt: skip
            elif cancel and not run.cancel_requested:
                self._cancel(run)

    def _cancel(self, run: _Run) -> None:
        """An operator cancelled this held job: stop it, or drop it if it has not started."""
        run.cancel_requested = True
        started = run not in self._held_back
        if not started:
            self._held_back.remove(run)
        self._settle(run, lifecycle.CancelRequested(started=started), 0.0)

    def _expire_timeouts(self, now: float) -> None:
        for run in [run for run in self._timed if (d := run.deadline) and now >= d]:
            job = run.job
            run.abandoned = run.timed_out = True
            run.ctx.cancel()
            self._forget(run)
            # The thread stays busy until the handler returns: replace it.
            self._start_executor()
            exc = TimeoutError(f"handler ran longer than its {run.timeout:g}s timeout")
            self._settle(run, self._failure(job, exc), now - run.started)

    def _release(self, runs: list[_Run]) -> None:
        released = self._db(lambda: self._queryset.release(run.job for run in runs))
        self.stats.released += released or 0

    def _begin_shutdown(self) -> float:
        # Queued runs come back from the executors unstarted and are released.
        self._draining = True
        if self._held_back:
            self._release(list(self._held_back))
            self._held_back.clear()
        return time.monotonic() + self.grace

    def _finish_shutdown(self) -> None:
        # Settle what threads reported since the last look: only a job a thread is
        # still running (or never started) may be released with its attempt given back.
        self._drain_inbox(0)
        if self._to_release:
            self._release(self._to_release)
            self._to_release = []
        unfinished = [run for run in self._inflight if not run.abandoned]
        for run in unfinished:
            run.abandoned = True
            run.ctx.cancel()
        if unfinished:
            self._release(unfinished)
            logger.warning(
                "worker %s: %d job(s) still running after the grace period were released "
                "without consuming an attempt", self.id, len(unfinished),
            )  # fmt: skip
        self._inflight.clear()
        self._timed.clear()
        if self._done:
            self._flush_done()
        for _ in range(3):
            if not self._unsettled:
                break
            self._retry_unsettled()

    # ---- threads ----------------------------------------------------------

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_executor(self) -> None:
        self._start_thread(self._execute_loop, f"django-jobs-executor-{len(self._threads)}")

    def _shutdown_threads(self) -> None:
        self._closing.set()
        for _ in self._threads:
            self._work.put(_STOP_EXECUTOR)
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        connections[self.database].close()

    def _execute_loop(self) -> None:
        last_job = time.monotonic()
        # This thread's connection wrappers, looked up once: they live as long as the thread.
        own = [connections[alias] for alias in connections]
        try:
            while True:
                run = self._work.get()
                if run is _STOP_EXECUTOR:
                    return
                if self._draining:
                    self._inbox.put(_Finished(run, lifecycle.Unstarted(), 0.0))
                    continue
                if time.monotonic() - last_job > IDLE_CHECK:
                    _check_connections(own)
                # Every run taken from the queue is reported, whatever happens in it:
                # a run stays in flight (and its lease extended) only until then.
                self._inbox.put(self._execute(run, own))
                last_job = time.monotonic()
                if run.timed_out:
                    return  # a replacement thread took this one's place
        finally:
            connections.close_all()

    def _execute(self, run: _Run, own: list[Any]) -> _Finished:
        """Run one job on this thread and return its report; it never raises."""
        run.started = time.monotonic()
        try:
            outcome = self.outcome_of(run)
        except BaseException as exc:  # noqa: BLE001 - outcome_of catches all; this is the net
            outcome = self._failure(run.job, exc)
        try:
            _tidy_connections(own)
        except BaseException:  # noqa: BLE001 - a handler can leave a connection in any state
            for conn in own:
                _close_quietly(conn)
        return _Finished(run, outcome, time.monotonic() - run.started)

    def outcome_of(self, run: _Run) -> Outcome:
        """Run a claimed job's handler on this thread and return what happened.

        It never raises. Whatever the handler or its validator raises, any
        BaseException included (KeyboardInterrupt, SystemExit, CancelledError,
        GeneratorExit), is a failed attempt: executors are not the main thread,
        so the worker's own SIGINT/SIGTERM handling never meets it.
        """
        job, handler, ctx = run.job, run.handler, run.ctx
        if run.cancel_requested:  # cancelled while it waited for this thread
            return self._failure(job, JobCancelled("cancelled before it started"))
        try:
            payload = payloads.decode(job.payload)
            if handler.validate is not None:
                validated = handler.validate(payload)
                payload = payload if validated is None else validated
        except (ValueError, TypeError, ValidationError) as exc:
            return lifecycle.Invalid(error_entry(job.attempts, exc=exc, worker=self.id))
        except BaseException as exc:  # noqa: BLE001 - a validator that breaks fails the attempt
            return self._failure(job, exc)
        try:
            if signals.job_started.receivers:
                signals.job_started.send(
                    sender=job.name, job_id=job.id, name=job.name, queue=job.queue,
                    attempt=job.attempts,
                )  # fmt: skip
            if handler.atomic:
                return self._run_atomic(run, payload)
            return _Succeeded(payloads.encode_result(_call(handler, payload, ctx)))
        except Snooze as exc:
            seconds = getattr(exc, "seconds", None)
            if type(seconds) is float and 0.0 <= seconds <= Snooze.MAX_SECONDS:
                return lifecycle.Snoozed(seconds)
            return self._failure(job, exc)  # a Snooze tampered with after it was made
        except FatalError as exc:
            return self._failure(job, exc, fatal=True)
        except BaseException as exc:  # noqa: BLE001 - a handler may raise anything
            return self._failure(job, exc)

    def _failure(self, job: ClaimedJob, exc: BaseException, fatal: bool = False) -> _Failed:
        return _Failed(error_entry(job.attempts, exc=exc, worker=self.id), fatal=fatal, exc=exc)

    def _run_atomic(self, run: _Run, payload: Any) -> Outcome:
        job = run.job
        try:
            with transaction.atomic(using=self.database):
                result = payloads.encode_result(_call(run.handler, payload, run.ctx))
                if run.abandoned:
                    raise LeaseLost(f"job {job.id} timed out or was released; rolling back")
                if not self._queryset.complete_atomically(job, result):
                    raise _MarkerExists
        except _MarkerExists:
            return lifecycle.AlreadyDone()
        except LeaseLost:
            return lifecycle.Lost()
        return lifecycle.SettledAtomically()

    def _listen(self) -> None:
        channel = conf.get("CHANNEL")
        pause = RETRY_MIN
        while not self._closing.is_set():
            conn = connections[self.database]
            try:
                conn.ensure_connection()
                raw = conn.connection
                with conn.cursor() as cursor:
                    cursor.execute(f"LISTEN {conn.ops.quote_name(channel)}")
                # Jobs enqueued while this connection was not listening got no
                # notification: claim once to catch them.
                self._inbox.put(_Wake(None))
                pause = RETRY_MIN
                while not self._closing.is_set():
                    for note in raw.notifies(timeout=LISTEN_TIMEOUT):
                        self._inbox.put(_Wake(note.payload))
            except Exception:  # noqa: BLE001 - any failure means: reconnect
                if self._closing.is_set():
                    break
                logger.warning("worker %s: listener lost its connection; reconnecting in %.1fs",
                               self.id, pause, exc_info=True)  # fmt: skip
                _close_quietly(conn)
                self._closing.wait(pause)
                pause = min(RETRY_MAX, pause * 2)
        _close_quietly(connections[self.database])

    # ---- database access ------------------------------------------------------

    def _db(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        """Run operation; on a connection error, reconnect later and return None.

        With `settle`, any other error (the database refused this row's write:
        a value, a trigger, a constraint) comes back as a _DbRefused, for the
        caller to record against that one job instead of retrying it forever.
        """
        conn = connections[self.database]
        try:
            result = operation()
        except _DB_ERRORS as exc:
            self._db_failures += 1
            pause = min(RETRY_MAX, RETRY_MIN * 2 ** min(self._db_failures - 1, 10))
            logger.warning(
                "worker %s: database error (%s); retrying in %.1fs",
                self.id, storable_text(safe_str(exc), MAX_MESSAGE), pause,
            )  # fmt: skip
            _close_quietly(conn)
            self._pause(pause)
            return None
        except Exception as exc:
            if not settle:
                if not isinstance(exc, DatabaseError):
                    raise
                # A statement failed (a constraint, a trigger): the connection is fine.
                logger.exception("worker %s: database operation failed", self.id)
                self._pause(RETRY_MIN)
                return None
            # Capped: PostgreSQL's error context can quote megabytes of the value.
            logger.error(
                "worker %s: the database refused a settle (%s: %s)",
                self.id, type_name(exc), storable_text(safe_str(exc), MAX_MESSAGE),
                exc_info=not isinstance(exc, DatabaseError),
            )  # fmt: skip
            return _DbRefused(exc)
        self._db_failures = 0
        return result

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake early for a stop request."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._inbox.get(timeout=left)
            except queue_module.Empty:
                return
            self._handle(event)
            if self._stopping:
                return

    def _clear_query_log(self) -> None:
        conn = connections[self.database]
        if conn.queries_logged:
            conn.queries_log.clear()


class _MarkerExists(Exception):
    pass


def _call(handler: Handler, payload: Any, ctx: JobContext) -> Any:
    if handler.is_async:
        # async_to_sync sends the coroutine's thread-sensitive sync_to_async calls
        # (the ORM) back to this thread, so they use this thread's connection.
        return async_to_sync(handler.func)(payload, ctx)
    return handler.func(payload, ctx)


def _tidy_connections(own: list[Any]) -> None:
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


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except DatabaseError:
        pass
