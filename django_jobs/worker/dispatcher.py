"""The dispatcher: the loop that claims jobs, hands them to the executors and settles them.

The thread that calls ``Worker.run`` owns one database connection and does every
claim, settle and heartbeat. Upkeep (heartbeat row, schedules, pruning) is a
separate service (django_jobs.worker.upkeep) that the loop ticks; it sees the
worker only through UpkeepHost.
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
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_jobs import conf, flow, lifecycle, registry
from django_jobs.attempts import DeadReason, lease_token
from django_jobs.context import JobContext
from django_jobs.lifecycle import Outcome
from django_jobs.models import Job, JobQuerySet
from django_jobs.registry import Handler
from django_jobs.rows import ClaimedJob, ClaimRequest
from django_jobs.store import JobStore
from django_jobs.worker import options, runs
from django_jobs.worker.chunks import Chunks
from django_jobs.worker.eventloop import LoopExecutor
from django_jobs.worker.executor import ThreadExecutor
from django_jobs.worker.guard import DbGuard
from django_jobs.worker.listener import Listener
from django_jobs.worker.runs import (
    DatabaseAway,
    Extend,
    Finished,
    HandlersStuck,
    Progress,
    Run,
    Stop,
    Wake,
    WorkerStats,
    log_extra,
    named_runs,
)
from django_jobs.worker.settle import DbRefused, Settler, finished_of
from django_jobs.worker.slots import Slots
from django_jobs.worker.timeouts import Timeouts
from django_jobs.worker.upkeep import Upkeep

logger = logging.getLogger("django_jobs.worker")

# Successes wait at most this long (or for a full batch) before being settled together.
FLUSH_INTERVAL = 0.01

# The default of the options that __post_init__ reads from DJANGO_JOBS when left None:
# the fields are typed as resolved, the constructor (see __init__ below) takes None.
_FROM_SETTINGS: Any = None


@dataclass
class Worker:
    """Run jobs until stopped (or, in burst mode, until nothing is due)."""

    queues: list[str] = _FROM_SETTINGS
    concurrency: int = _FROM_SETTINGS
    async_concurrency: int = _FROM_SETTINGS
    batch: int = _FROM_SETTINGS
    lease: float = _FROM_SETTINGS
    heartbeat: float = _FROM_SETTINGS
    grace: float = _FROM_SETTINGS
    poll_interval: float = _FROM_SETTINGS
    listen: bool = _FROM_SETTINGS
    burst: bool = False
    max_jobs: int | None = None
    database: str = _FROM_SETTINGS
    stats: WorkerStats = field(default_factory=WorkerStats)

    if TYPE_CHECKING:  # the dataclass's own __init__, as callers see it

        def __init__(
            self,
            queues: list[str] | None = None,
            concurrency: int | None = None,
            async_concurrency: int | None = None,
            batch: int | None = None,
            lease: float | None = None,
            heartbeat: float | None = None,
            grace: float | None = None,
            poll_interval: float | None = None,
            listen: bool | None = None,
            burst: bool = False,
            max_jobs: int | None = None,
            database: str | None = None,
            stats: WorkerStats = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        settings = conf.get_settings()
        self.database = self.database or settings["DATABASE"]
        try:  # before any SQL: a lease of 1e13 s would fail every claim
            options.resolve(self, settings)
        except ValueError as exc:
            raise ImproperlyConfigured(f"Worker: {exc}") from None
        if cast("bool | None", self.listen) is None:
            self.listen = bool(settings["LISTEN"])
        self.listen = self.listen and JobStore(self.database).listens
        if not self.queues:
            self.queues = sorted(registry.declared_queues())
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._claims = itertools.count(1)
        self._inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        # Runs handed to the executors (queued or running), and those a per-handler cap holds back.
        self._inflight: set[Run] = set()
        self._held_back: deque[Run] = deque()
        self._by_name: dict[str, int] = {}
        self._next_unsettled_retry = 0.0
        self._threads: list[threading.Thread] = []  # the listener's
        self._stopping = False
        self._closing = threading.Event()
        self._more = True  # jobs may be due: claim without waiting for the poll
        self._queryset: JobQuerySet = Job.objects.using(self.database)
        self._store = JobStore(self.database)
        self._settler = Settler(self, self._store)  # outcomes settled (worker/settle.py)
        # Sync handlers on threads; async ones on one event loop (its ORM calls on threads).
        self._executor = ThreadExecutor(
            size=self.concurrency,
            worker_id=self.id,
            database=self.database,
            store=self._store,
            report=self._inbox.put,
        )
        self._eventloop: LoopExecutor | None = LoopExecutor(
            slots=self.async_concurrency,
            orm_threads=self.concurrency,
            worker_id=self.id,
            report=self._inbox.put,
        )
        self._chunks = Chunks(submit=self._executor.submit)  # chunk handlers' jobs waiting
        # Runs with a timeout, and handlers past it still running (worker/timeouts.py).
        self._timeouts = Timeouts(self, self._executor.stuck, self._eventloop)
        self._slots = Slots(threads=self.concurrency, loop=self.async_concurrency, batch=self.batch)
        self._claimed_total = 0
        self._guard = DbGuard(database=self.database, worker_id=self.id, pause=self._pause)
        self._timeout_by_name: dict[str, float | None] = {}
        self._excluded: set[str] = set()  # capped handlers the last claim left out
        # The job names this worker claims (and publishes in its heartbeat row).
        self.names = sorted(registry.all_handlers())
        self._names_generation = registry.generation()
        self._slots.split(self.names, registry.all_handlers())
        self._flow_limits = options.flow_limits(self._store)
        self._limited = {g.value for g in self._flow_limits if g.kind == "name"}
        self._limited_queues = {g.value for g in self._flow_limits if g.kind == "queue"}
        self._flow_freed = False  # a limited job finished: settle it, then claim again
        self._freed: set[str] = set()  # groups it freed slots of: NOTIFY unless it refills
        # The limited groups (keys) the next claim looks at: all at each poll and wake-up,
        # then those with a freed slot or found by the last claim (fewer statements).
        self._flow_due: set[str] = {g.key for g in self._flow_limits}
        # With limits: whether the next claim looks for other jobs too (not after a short
        # one, until a poll or wake-up: a freed limited slot is then claimed alone).
        self._others_due = True
        # Burst mode: a short claim while due work remains (held rows, a lock race, a limit):
        # when to look again, and how many such looks in a row found nothing.
        self._look_again_at: float | None = None
        self._empty_looks = 0
        self._ops = Upkeep(self)  # heartbeat row, schedules, pruning, counters

    # ---- public -----------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let running jobs finish within the grace period, then return."""
        self._inbox.put(Stop())

    def run(self) -> None:
        """Work until stopped (or, in burst mode, until nothing is due)."""
        logger.info(
            "worker %s starting: %squeues=%s concurrency=%d async_concurrency=%d batch=%d "
            "lease=%.0fs",
            self.id,
            f"database={self.database} " if len(conf.databases()) > 1 else "",
            ",".join(self.queues),
            self.concurrency,
            self.async_concurrency,
            self.batch,
            self.lease,
        )
        self._executor.start()
        if self.listen and not self.burst:  # burst mode drains and leaves: nothing to wait for
            listener = Listener(
                database=self.database,
                channel=conf.get("CHANNEL"),
                wake=lambda queue: self._inbox.put(Wake(queue)),
                closing=self._closing,
                worker_id=self.id,
            )
            thread = threading.Thread(target=listener.run, name="django-jobs-listener", daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            self._ops.start()
            self._loop()
        finally:
            if not self._guard.away_for(time.monotonic()):  # else it would only wait again
                self._ops.stopped()
            self._shutdown_executors()
        where = f" (database {self.database})" if len(conf.databases()) > 1 else ""
        logger.info("worker %s stopped%s: %s", self.id, where, self.stats.summary())
        if self._timeouts.all_stuck is not None:
            raise HandlersStuck(self._timeouts.all_stuck)

    # ---- what upkeep, timeouts and the settler see (their Host protocols) --------

    def running(self) -> int:
        """Return how many jobs this worker has handed to its executors."""
        return len(self._inflight)

    def guarded(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        """Run operation on the dispatcher's connection; None after a database error."""
        return self._db(operation, settle=settle)

    def claim_soon(self) -> None:
        self._more = True

    def reported(self, job: ClaimedJob, outcome: str, error: Any, duration: float | None) -> None:
        self._ops.finished(outcome, duration)

    def give_back_held(self, name: str) -> None:
        """Release the runs of job name held back by its cap (abandoned runs fill it)."""
        self._settler.to_release.extend(run for run in self._held_back if run.job.name == name)
        self._held_back = deque(run for run in self._held_back if run.job.name != name)

    def settle_late(self, run: Run, outcome: Outcome, duration: float) -> None:
        """Settle an abandoned run's TimeoutError once its handler returned (or at exit)."""
        self._forget(run)
        self._settler.settle(run, outcome, duration)

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
            if self.burst and (away := self._guard.away_for(now)) >= runs.BURST_PATIENCE:
                raise DatabaseAway(
                    f"database {self.database!r} failed every statement for {away:.0f}s: "
                    "a burst worker gives up (its unsettled jobs are rescued once their "
                    "leases expire)"
                )

            if self._timeouts.timed:
                self._timeouts.expire(now)
            if self._chunks.pending and not self._stopping:
                self._chunks.hand_out_due(now, everything=self.burst and not self._more)
            if not self._stopping and self._timeouts.gave_up(now):
                self._stopping = True  # every thread is stuck: exit for a restart
                grace_deadline = self._begin_shutdown()
            if self._settler.to_release:
                self._release(self._settler.to_release)
                self._settler.to_release = []
            # A limited job finished: its settle goes with the claim that refills its
            # slot (one transaction, one round trip), unless there is no claim to make.
            claims_now = not self._stopping and self._want_claim(now >= next_poll)
            settle_with_claim = bool(self._settler.done and self._flow_freed and claims_now)
            if (
                self._settler.done
                and not settle_with_claim
                and (
                    len(self._settler.done) >= self.batch
                    or self._flow_freed
                    or now - self._settler.done_since >= FLUSH_INTERVAL
                    or self._stopping
                    or not (self._inflight or self._more)
                )
            ):
                self._settler.flush()
            if self._freed:
                if not claims_now:  # settled above: tell the workers that can refill them
                    self._tell_freed(self._freed)
                self._freed = set()
            self._flow_freed = False
            if self._settler.unsettled and now >= self._next_unsettled_retry:
                self._settler.retry_unsettled()
                self._next_unsettled_retry = now + 1.0

            if self._stopping:
                assert grace_deadline is not None  # set above once stopping
                stuck = self._timeouts.all_stuck is not None
                if not self._inflight or now >= grace_deadline or stuck:
                    self._finish_shutdown()
                    return
                continue

            self._ops.tick(now)
            if self._look_again_at is not None and now >= self._look_again_at:
                next_poll = now  # burst mode: due work the last claim could not take
            if settle_with_claim or self._want_claim(now >= next_poll) or self._ops.beat_due(now):
                if now >= next_poll:
                    self._look_everywhere()
                got, asked = self._claim(settle=settle_with_claim)
                if asked:
                    # A burst worker's short claim may have lost a race for rows: it
                    # claims again at once, and asks the database only after an empty one.
                    self._more = got >= asked or (self.burst and got > 0)
                    self._look_again_at = None
                next_poll = time.monotonic() + self.poll_interval

            if self.heartbeat and now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.heartbeat
            self._clear_query_log()

            if self._finished_work():
                self._timeouts.settle_at_exit()
                self._settler.flush()
                if not self._settler.unsettled:
                    return

    def _next_timeout(
        self, now: float, next_poll: float, next_heartbeat: float, grace_deadline: float | None
    ) -> float:
        if not self._stopping and self._want_claim(poll_due=False):
            return 0.0
        deadlines = [next_poll]
        if self._inflight or self._held_back:
            deadlines.append(next_heartbeat)
        if self._settler.done:
            deadlines.append(self._settler.done_since + FLUSH_INTERVAL)
        if self._settler.unsettled:
            deadlines.append(self._next_unsettled_retry)
        if grace_deadline is not None:
            deadlines.append(grace_deadline)
        if self._look_again_at is not None:
            deadlines.append(self._look_again_at)
        deadlines.append(self._chunks.next_flush(now, everything=self.burst and not self._more))
        deadlines.extend(self._timeouts.deadlines(now))
        return max(0.0, min(deadlines) - now)

    def _shutdown_executors(self) -> None:
        self._closing.set()  # the listener's
        if self._eventloop is not None:
            blocked = self._eventloop.loop_blocker() is not None
            self._eventloop.shutdown(timeout=0.0 if blocked else 2.0)
        self._executor.shutdown(timeout=2.0)
        for thread in self._threads:
            thread.join(timeout=1.0)
        connections[self.database].close()

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
        if isinstance(event, Finished):
            self._on_finished(event)
        elif isinstance(event, Wake):
            if event.queue is not None and event.queue.startswith(flow.FREED):
                # Another worker freed a slot of a group it will not refill itself.
                key = event.queue[len(flow.FREED) :]
                if any(g.key == key for g in self._flow_limits):
                    self._more = True
                    self._flow_due.add(key)
            elif event.queue is None or event.queue in self.queues:
                self._more = True
                self._look_everywhere()
        elif isinstance(event, Extend):
            run = event.run
            if run in self._inflight and not run.abandoned:
                self._db(lambda: self._store.extend_leases([run.job], event.seconds))
        elif isinstance(event, Progress):
            run = event.run
            if run in self._inflight and not run.abandoned:
                self._db(lambda: self._store.write_progress(run.job, event.value))
        elif isinstance(event, Stop):
            if not self._stopping:
                logger.info(
                    "worker %s stopping: finishing running jobs (grace %.0fs)", self.id, self.grace
                )
            self._stopping = True

    def _finished_work(self) -> bool:
        """In burst or max-jobs mode: True once there is nothing left to do."""
        if (
            self._timeouts.running_on()
            or self._held_back
            or self._settler.done
            or self._settler.to_release
        ):
            return False
        if self.max_jobs is not None and self._claimed_total >= self.max_jobs:
            return True
        if not self.burst or self._more or self._look_again_at is not None:
            return False
        # The last claim came back short: only the database can say whether that was
        # "nothing due" or due work it could not take now (rows another claim held, a
        # lock race, a limit's full slots or window). Then wait, and look again.
        due = self._db(self.due)
        if due is False:
            return True
        self._look_again_at = time.monotonic() + self.pause_before_looking_again()
        return False

    def due(self) -> bool:
        """Whether the database holds a job due for this worker, row locks and limits aside."""
        return self._queryset.any_due(queues=self.queues, names=self.names)

    def pause_before_looking_again(self) -> float:
        """How long to wait for due work the last claim could not take (burst mode, drain)."""
        looks, self._empty_looks = self._empty_looks, self._empty_looks + 1
        return options.look_again_in(looks, self.poll_interval, self._flow_limits)

    def _look_everywhere(self) -> None:
        """Make the next claim look at every limited group and at the other jobs."""
        self._flow_due = {g.key for g in self._flow_limits}
        self._others_due = True
        self._slots.wake()

    # ---- claiming ---------------------------------------------------------

    def _free_slots(self) -> int:
        free = self._slots.free(self._busy(), self._held_back)
        if self.max_jobs is not None:
            free = min(free, self.max_jobs - self._claimed_total)
        return max(0, min(free, self.batch))

    def _want_claim(self, poll_due: bool) -> bool:
        if not (self._more or poll_due):
            return False
        free = self._free_slots()
        return free > 0 and self._slots.claim_now(free, self._busy())

    def _busy(self) -> int:  # jobs in flight as slots count them (worker/chunks.py)
        return len(self._inflight) - self._chunks.discount

    def _claim(self, settle: bool = False) -> tuple[int, int]:
        """Claim what the free slots can take; with `settle`, settle the successes first."""
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
        first_share, *other_shares = shares = self._slots.shares(
            self.names, asked, self._busy(), self._held_back, self._excluded
        )
        asked = sum(share.limit for share in shares)
        beat = self._ops.beat(time.monotonic())
        # Rotate the queues so that a busy one does not always come first.
        first = seq % len(self.queues)
        queues = self.queues[first:] + self.queues[:first]
        request = ClaimRequest(
            queues=queues,
            limit=first_share.limit,
            token=token,
            lease=self.lease,
            exclude_names=capped,
            beat=beat,
            names=first_share.names,
            flow_limits=self._flow_limits,
            flow_claim=self._flow_due,
            others=self._others_due,
        )
        batch = self._settler.take_done() if settle else []
        if not batch:
            jobs = self._db(lambda: self._store.claim(request))
        else:
            found = self._db(
                lambda: self._store.complete_and_claim(finished_of(batch), request),
                settle=True,
            )
            if isinstance(found, DbRefused):
                # Both were rolled back: settle the batch alone (job by job if need be).
                self._settler.done = batch
                self._settler.flush()
                jobs = self._db(lambda: self._store.claim(request))
            else:
                self._settler.completed(batch, None if found is None else found[0])
                jobs = None if found is None else found[1]
        got_by_share = [] if jobs is None else [len(jobs)]
        for share in other_shares if jobs is not None else ():  # the other kind's, no beat
            other = request._replace(limit=share.limit, names=share.names, beat=None)
            jobs += (theirs := self._db(partial(self._store.claim, other)) or [])
            got_by_share.append(len(theirs))
        if jobs is None:
            return asked, asked  # the database is away: try again, do not conclude "idle"
        got = len(jobs)
        if self._slots.claimed(shares, got_by_share):
            got = max(got, asked)  # a kind's share came back full: more may be due
        if got:
            self._empty_looks = 0
        if self._flow_limits:
            looked_everywhere = self._others_due and len(self._flow_due) == len(self._flow_limits)
            self._flow_due = {key for job in jobs if (key := self._group_of(job))}
            # The other half found fewer than asked: none left until a poll or wake-up.
            self._others_due = self._others_due and got >= asked
            if self.burst and got < asked and not looked_everywhere:
                self._look_everywhere()  # every group, before asking whether any is due
                got = asked
        self._claimed_total += len(jobs)
        self.stats.claimed += len(jobs)
        for job in jobs:
            self._accept(job)
        return got, asked

    def _names_changed(self) -> None:
        self._names_generation = registry.generation()
        self.names = sorted(registry.all_handlers())
        self._slots.split(self.names, registry.all_handlers())
        self._flow_limits = options.flow_limits(self._store)
        self._limited = {g.value for g in self._flow_limits if g.kind == "name"}
        self._limited_queues = {g.value for g in self._flow_limits if g.kind == "queue"}
        self._ops.names_changed()
        logger.info("worker %s: now claims %d job name(s)", self.id, len(self.names))

    def _accept(self, job: ClaimedJob) -> None:
        """Settle at once what must not run; hand the rest to the executors."""
        handler = registry.lookup(job.name) if type(job.name) is str else None
        transition = lifecycle.on_claim(job, has_handler=handler is not None)
        if getattr(transition, "retaken", False):
            self.stats.reexecuted += 1
            logger.warning(
                "job %s[%s]: attempt %d's lease expired (worker %s); taking it over as attempt %d",
                job.name,
                job.id,
                job.attempts - 1,
                job.errors[-1].get("worker", "?"),
                job.attempts,
                extra=log_extra(job),
            )
        if isinstance(transition, lifecycle.Run):
            assert handler is not None  # on_claim runs only a job that has one
            ctx = JobContext(
                id=job.id,
                name=job.name,
                queue=job.queue,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                enqueued_at=job.enqueued_at,
                dedupe_key=job.key,
                worker_id=self.id,
                database=self.database,
                started_at=job.started_at,
                errors=job.errors,
                _parents=partial(self._store.parent_results, job.id),
            )
            on_loop = self._slots.runs_on_loop(handler)
            run = Run(job, handler, ctx, timeout=self._timeout_of(handler), on_loop=on_loop)
            ctx._extend = lambda seconds: self._inbox.put(Extend(run, seconds))
            ctx._report = lambda value: self._inbox.put(Progress(run, value))
            self._hand_out(run)
        elif isinstance(transition, lifecycle.Complete):
            logger.info(
                "job %s already completed (marker exists): settling without running",
                job.id,
                extra=log_extra(job),
            )
            self._settler.carry_out(Run(job, None, None), transition, 0.0)
        elif isinstance(transition, lifecycle.Release):
            logger.warning(
                "job %s: no handler %r in this worker any more: released",
                job.id,
                job.name,
                extra=log_extra(job),
            )
            self._settler.to_release.append(Run(job, None, None))
            self._names_generation = -1  # claim by the registry's names from now on
        else:
            assert isinstance(transition, lifecycle.DeadLetter)  # what on_claim has left
            if transition.reason == DeadReason.MALFORMED:
                job.make_storable()
            self._settler.carry_out(Run(job, None, None), transition, 0.0)

    def _timeout_of(self, handler: Handler) -> float | None:
        try:
            return self._timeout_by_name[handler.name]
        except KeyError:
            return self._timeout_by_name.setdefault(handler.name, handler.get_timeout())

    def _hand_out(self, run: Run) -> None:
        """Queue run for the executors, unless its handler's cap is reached."""
        name = run.job.name
        assert run.handler is not None  # a run handed out has one
        cap = run.handler.concurrency
        if cap and self._by_name.get(name, 0) >= cap:
            self._held_back.append(run)
            return
        self._inflight.add(run)
        self._ops.started()
        self._by_name[name] = self._by_name.get(name, 0) + 1
        if run.timeout:
            self._timeouts.timed.add(run)
        if run.handler.chunk:  # held until its chunk fills or has waited chunk_wait
            self._chunks.add(run)
        elif run.on_loop:
            assert self._eventloop is not None  # on_loop only with a loop
            self._slots.on_loop += 1
            self._eventloop.submit(run)
        else:
            self._executor.submit(run)

    def _release_held_back(self) -> None:
        waiting, self._held_back = self._held_back, deque()
        for run in waiting:
            self._hand_out(run)

    # ---- outcomes -----------------------------------------------------------

    def _on_finished(self, event: Finished) -> None:
        run = event.run
        if run.abandoned:
            if run in self._timeouts.abandoned:
                self._timeouts.returned(run, event.outcome, event.duration)
            return  # what an abandoned run reports is never settled
        self._forget(run)
        if type(event.outcome) is lifecycle.Unstarted:
            self._settler.settle(run, event.outcome, 0.0)  # released, attempt not counted
            return
        # Short jobs are queued ahead of free slots so that claims stay few; long
        # ones only as slots free up, so one worker does not hoard them.
        self._slots.finished(run, event.duration)
        self._settler.settle(run, event.outcome, event.duration)

    def _forget(self, run: Run) -> None:
        if run in self._inflight:
            self._inflight.discard(run)
            self._timeouts.timed.discard(run)
            if run.on_loop:
                self._slots.on_loop -= 1
            elif run.handler is not None and run.handler.chunk:
                self._chunks.left(run)
            name = run.job.name
            left = self._by_name.get(name, 1) - 1
            if left:
                self._by_name[name] = left
            else:
                self._by_name.pop(name, None)
            if name in self._excluded:
                self._more = self._others_due = True  # the last claim skipped its jobs
            if self._flow_limits and (key := self._group_of(run.job)):
                # A fleet-wide slot frees at its settle: settle, then claim the group's jobs.
                self._more = self._flow_freed = True
                self._flow_due.add(key)
                self._freed.add(key)
            if self._held_back and not self._stopping:
                self._release_held_back()

    def _tell_freed(self, keys: set[str]) -> None:
        """NOTIFY the fleet that slots of these groups freed (a wake-up for that group only)."""
        self._db(lambda: self._store.notify_freed(keys))

    def _group_of(self, job: ClaimedJob) -> str | None:
        """Return the key of the limited group that holds job, if any (its handler's first)."""
        if job.name in self._limited:
            return f"name:{job.name}"
        return f"queue:{job.queue}" if job.queue in self._limited_queues else None

    # ---- leases, timeouts and shutdown --------------------------------------

    def _heartbeat(self) -> None:
        held = [run for run in self._inflight if not run.abandoned or run.timed_out]
        held += self._held_back
        if not held:
            return
        leases = self._db(lambda: self._store.extend_leases([run.job for run in held], self.lease))
        if leases is None:
            return
        for run in held:  # progress reported since its last write (at most one a second)
            if run.ctx is not None:
                run.ctx.flush_progress()
        # A job neither held nor lost was settled by its own atomic handler, whose
        # report is on its way: not a takeover, nothing to cancel.
        for run in held:
            if run.job.id in leases.lost:
                if run.ctx is not None:
                    run.ctx.cancel()
                logger.warning(
                    "job %s: lease lost (another worker took it over)",
                    run.job.id,
                    extra=log_extra(run.job),
                )
            elif leases.held.get(run.job.id) and not run.cancel_requested:
                self._cancel(run)

    def _cancel(self, run: Run) -> None:
        """An operator cancelled this held job: stop it, or drop it if it has not started."""
        run.cancel_requested = True
        started = run not in self._held_back
        if not started:
            self._held_back.remove(run)
        elif self._chunks.remove(run, self._forget):  # waiting for its chunk: never started
            started = False
        self._settler.settle(run, lifecycle.CancelRequested(started=started), 0.0)
        if started and run.on_loop and self._eventloop is not None:
            self._eventloop.cancel(run)  # an async handler is stopped at its current await

    def _release(self, runs: list[Run]) -> None:
        released = self._db(lambda: self._store.release(run.job for run in runs))
        self.stats.released += released or 0

    def _begin_shutdown(self) -> float:
        # Queued runs come back from the executors unstarted and are released.
        self._executor.drain()
        if self._eventloop is not None and self._eventloop.started:
            self._eventloop.drain()
        if self._chunks.pending:  # chunks not yet run: their jobs go back to the queue
            self._release(self._chunks.take_buffered(self._forget))
        if self._held_back:
            self._release(list(self._held_back))
            self._freed.update(k for run in self._held_back if (k := self._group_of(run.job)))
            self._held_back.clear()
        return time.monotonic() + self.grace

    def _finish_shutdown(self) -> None:
        # Settle what threads reported since the last look: only a job a thread is
        # still running (or never started) may be released with its attempt given back.
        self._drain_inbox(0)
        if self._settler.to_release:
            self._release(self._settler.to_release)
            self._settler.to_release = []
        unfinished = [run for run in self._inflight if not run.abandoned]
        for run in unfinished:
            run.abandoned = True
            assert run.ctx is not None  # a run handed out has one
            run.ctx.cancel()
            if run.on_loop and self._eventloop is not None:
                self._eventloop.cancel(run)
        if unfinished:
            self._release(unfinished)
            logger.warning(
                "worker %s: %d job(s) still running after the grace period (%s) were released "
                "without consuming an attempt; another worker runs them again: %s",
                self.id,
                len(unfinished),
                f"{self.grace:g}s",
                named_runs(unfinished, time.monotonic()),
            )
        self._timeouts.settle_at_exit()
        self._inflight.clear()
        self._timeouts.timed.clear()
        if self._settler.done:
            self._settler.flush()
        for _ in range(3):
            if not self._settler.unsettled:
                break
            self._settler.retry_unsettled()
        self._freed.update(k for run in unfinished if (k := self._group_of(run.job)))
        if self._freed:
            self._tell_freed(self._freed)

    # ---- database access ------------------------------------------------------

    def _db(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        """Run operation on the dispatcher's connection (django_jobs.worker.guard)."""
        return self._guard.run(operation, settle=settle)

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
