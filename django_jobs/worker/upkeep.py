"""A worker's upkeep: its heartbeat row, schedule ticks, pruning, and its counters.

``Worker`` builds one ``Upkeep`` and calls it from a few places in its
dispatcher loop (start, tick, beat_due/beat, started/finished, names_changed,
stopped); upkeep sees the worker only through ``UpkeepHost``. Everything here
runs on the dispatcher's connection, never per job, and a waiting worker still
makes one round trip per poll interval:

- the heartbeat row (last seen, running jobs, counters) is refreshed by the claim
  statement itself every MAINTENANCE_INTERVAL (``beat``); the row is written in
  full at start and every ROW_REFRESH seconds, when rows of workers gone for long
  are dropped too;
- schedules, when there are any, are reloaded every MAINTENANCE_INTERVAL and
  their ticks taken when due (estimated from the database clock);
- old markers and dead letters are pruned in time-boxed rounds, every
  MAINTENANCE_INTERVAL while there is something to prune, then every
  ROW_REFRESH seconds once there is not; on PostgreSQL each round also deletes
  the flow-control window counters of windows that ended long ago;
- paused queues need nothing here: the claim leaves them out;
- the claim takes only the names this worker has registered (published in its
  heartbeat row), so during a rolling deploy a job of a handler that only newer
  workers have waits for one of them. The names of claimable jobs that no
  live worker knows are recorded in UnknownName, with since when, for `jobs
  status`, the dashboard and the admin (every MAINTENANCE_INTERVAL while there
  are some, else every WORKER_EXPIRY / 2: the pass reads every claimable row);
  once a name has been unknown for UNKNOWN_NAME_GRACE, its jobs are
  dead-lettered as unknown_name. A pass that finds none clears the rows any
  worker wrote, and the last live worker clears its own when it exits cleanly.
  While a live worker does not publish its names (an earlier release), nothing
  is called unknown;
- on PostgreSQL, a worker that has been busy VACUUMs the jobs table when dead
  rows pile up in it (every finished job leaves one). Autovacuum usually does
  this, but it may be off, or slow to get to a small table that churns this
  fast; dead rows slow every claim down. After pruning, it VACUUMs the
  markers and dead letters too when autovacuum is off.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db.models.functions import Now
from django.utils import timezone

from django_jobs import conf, registry, retention, schedules, signals
from django_jobs.fleet import DURATION_BUCKETS, unknown_name_grace
from django_jobs.models import FlowWindow, Job, QueueState, UnknownName, WorkerBeat
from django_jobs.rows import Beat
from django_jobs.store import JobStore, sql
from django_jobs.worker import ticker
from django_jobs.worker.runs import WorkerStats

logger = logging.getLogger("django_jobs.worker")

# Longest a maintenance step may spend pruning before it returns to the jobs.
PRUNE_BUDGET = 0.25
# Seconds between full rewrites of the heartbeat row (and idle pruning checks).
ROW_REFRESH = 600.0
# Jobs this worker claims between two looks at the jobs table's dead rows, and
# how many dead rows (beyond the live ones) call for a VACUUM.
VACUUM_CHECK_JOBS = 20_000
VACUUM_MIN_DEAD = 10_000
# Rows pruned from markers or dead letters between two VACUUMs of that table
# (only when autovacuum is off: otherwise it takes care of them).
VACUUM_AFTER_PRUNED = 50_000
# The pass that looks for unknown names reads every claimable row: it waits at
# least this many times its own duration before the next one. It runs every
# MAINTENANCE_INTERVAL while it finds some, else every WORKER_EXPIRY / 2 (so
# that a waiting worker stays at about one round trip per poll), and never
# more seldom, so that its findings never look stale.
UNKNOWN_SCAN_SPACING = 50
# Jobs of an unknown name dead-lettered per transaction.
UNKNOWN_BATCH = 500


class UpkeepHost(Protocol):
    """What upkeep reads of its worker, and its one way to the database."""

    id: str
    database: str
    queues: list[str]
    concurrency: int
    names: list[str]
    stats: WorkerStats

    def running(self) -> int:
        """Return how many jobs the worker holds."""
        ...

    def guarded(self, operation: Callable[[], Any]) -> Any:
        """Run operation; on a connection error, replace the connection and return None."""
        ...


class Upkeep:
    """The operational side of one Worker. Every method runs on the dispatcher thread."""

    def __init__(self, host: UpkeepHost) -> None:
        self.host = host
        self.alias = host.database
        self.interval = float(conf.get("MAINTENANCE_INTERVAL"))
        self._next_beat = 0.0
        self._next_row = 0.0
        self._next_schedules = 0.0
        self._next_prune = 0.0
        self._next_unknown = 0.0
        self._unknown_found = False  # the last pass found names no live worker knows
        self._unknown_told: set[str] = set()  # names already logged: once each, not every pass
        self._grace = unknown_name_grace()  # a bad value fails here, at start
        self._clock: tuple[datetime, float] | None = None  # (database time, monotonic time)
        store = JobStore(self.alias)
        self._vacuums = store.vacuums  # PostgreSQL: VACUUM after pruning, when autovacuum is off
        self._windows = store.enforces_limits  # the flow-control windows it counts
        self._next_vacuum_check = VACUUM_CHECK_JOBS
        self._pruned: Counter[str] = Counter()
        self.ticker = ticker.Ticker(self.alias)
        self._prune_pause()  # bad retention settings fail here, at start, not every round
        self.counters: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # job_finished outcomes
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.started_at = timezone.now()

    # ---- hooks the worker calls ------------------------------------------------

    def start(self) -> None:
        """Register the worker's queues and schedules (once, before the first claim)."""

        def register() -> None:
            QueueState.objects.using(self.alias).ensure(self.host.queues)
            if schedules.declared_in(self.alias):
                ticker.sync(self.alias)

        self._step(register)

    def tick(self, now: float) -> None:
        """Run whatever upkeep is due at monotonic time `now` (cheap when nothing is)."""
        if now >= self._next_row:
            self._next_row = now + ROW_REFRESH
            self._step(self._write_row)
        if now >= self._next_unknown:
            self._next_unknown = now + self.interval  # later if the pass is slow
            self._step(self._unknown_names)
        if now >= self._next_schedules:
            self._next_schedules = now + self.interval  # not every loop, even with no schedules
            if schedules.declared_in(self.alias):
                self._step(self._refresh_schedules)
        due = self.ticker.next_due
        if due is not None and self._clock is not None and self._db_now(now) >= due:
            self._step(lambda: self.ticker.run_due(self._db_now(time.monotonic())))
        if now >= self._next_prune:
            self._next_prune = now + self._prune_pause()  # sooner if this round finds work
            self._step(lambda: self._prune(now))
        if self.host.stats.claimed >= self._next_vacuum_check and self._vacuums:
            self._next_vacuum_check = self.host.stats.claimed + VACUUM_CHECK_JOBS
            self._step(self._vacuum_jobs)

    def beat_due(self, now: float) -> bool:
        return now >= self._next_beat

    def beat(self, now: float) -> Beat | None:
        """What the next claim should write to the heartbeat row, if it is time to."""
        if now < self._next_beat:
            return None
        self._next_beat = now + self.interval
        return Beat(self.host.id, self.host.running(), json.dumps(self.snapshot()))

    def started(self) -> None:
        self.counters["started"] += 1

    def finished(self, outcome: str, duration: float | None) -> None:
        self.outcomes[outcome] += 1
        if duration is not None:
            self.duration_sum += duration
            for i, bound in enumerate(DURATION_BUCKETS):
                if duration <= bound:
                    self.durations[i] += 1
                    break
            else:
                self.durations[-1] += 1

    def names_changed(self) -> None:
        """Publish the worker's new set of job names at the next step."""
        self._next_row = 0.0

    def stopped(self) -> None:
        """Remove this worker's heartbeat row (a clean exit is not a dead worker).

        With it go the unknown names this worker recorded, unless another live
        worker remains: its upkeep confirms or clears them, and a name unknown to
        it too keeps its `since` (deleted, its grace would start again).
        """

        def leave() -> None:
            beats = WorkerBeat.objects.using(self.alias)
            beats.filter(id=self.host.id).delete()
            if self._unknown_found and not beats.live().exists():
                UnknownName.objects.using(self.alias).filter(
                    name__in=sorted(self._unknown_told)
                ).delete()

        self.host.guarded(leave)

    def snapshot(self) -> dict[str, Any]:
        """Counters since start, as stored in the heartbeat row (read by the metrics view)."""
        return {
            **dataclasses.asdict(self.host.stats),
            **self.counters,
            "rescued": self.host.stats.reexecuted,
            "outcomes": dict(self.outcomes),
            "scheduled": self.ticker.enqueued,
            "duration_buckets": list(self.durations),
            "duration_sum": self.duration_sum,
        }

    # ---- the steps -------------------------------------------------------------

    def _step(self, operation: Callable[[], Any]) -> None:
        # Upkeep must never stop a worker from running jobs: a failure here is
        # logged and tried again at the next step. Connection errors are handled
        # (and the connection replaced) by the host's guarded().
        try:
            self.host.guarded(operation)
        except Exception:  # noqa: BLE001
            logger.exception("worker %s: maintenance step failed; trying again later", self.host.id)

    def _write_row(self) -> None:
        rows = WorkerBeat.objects.using(self.alias)
        values = {
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            "queues": self.host.queues,
            "concurrency": self.host.concurrency,
            "started_at": self.started_at,
            "last_seen_at": timezone.now(),
            "running": self.host.running(),
            "stats": self.snapshot(),
            "handlers": self.host.names,
        }
        rows.update_or_create(id=self.host.id, defaults=values)
        # Rows of workers that died without a word: kept a while for `jobs status`, then dropped.
        expiry = timedelta(seconds=10 * float(conf.get("WORKER_EXPIRY")))
        rows.filter(last_seen_at__lt=Now() - expiry).delete()

    def _unknown_names(self) -> None:
        """Record the claimable jobs' names no live worker knows; bury those past the grace."""
        started = time.monotonic()
        # Names this worker lacks first: usually none, and then one query is all.
        found = {
            row["name"]: row["jobs"]
            for row in Job.objects.using(self.alias).names_unknown_to(self.host.names)
        }
        if found:
            live = WorkerBeat.objects.using(self.alias).live().exclude(id=self.host.id)
            for handlers in live.values_list("handlers", flat=True):
                if not isinstance(handlers, list):
                    # A worker of an earlier release: what it knows is not published.
                    found = {}
                    break
                for name in handlers:
                    found.pop(name, None)
        longest = float(conf.get("WORKER_EXPIRY")) / 2
        spacing = max(
            self.interval if found else longest, UNKNOWN_SCAN_SPACING * (time.monotonic() - started)
        )
        self._next_unknown = started + min(spacing, longest)
        if not found and not self._unknown_found:
            # Nothing is unknown to the live fleet: rows another worker wrote (one
            # that has exited, or whose names have run or are known since) are
            # stale. One small read while there are none, as there usually are.
            stale = UnknownName.objects.using(self.alias)
            if stale.exists():
                stale.delete()
            return
        self._unknown_found = bool(found)
        self._tell_unknown(found)
        now = ticker.db_now(self.alias)
        names = UnknownName.objects.using(self.alias)
        names.observe(found, now)
        if self._grace is None or not found:
            return
        for entry in names.filter(name__in=list(found), since__lte=now - self._grace):
            self._bury_unknown(entry.name, entry.since, now - self._grace)

    def _tell_unknown(self, found: dict[str, int]) -> None:
        # The usual first-run cause: a handler added while runjobs kept running the old code.
        # Without a line, its jobs would wait in silence until UNKNOWN_NAME_GRACE buries them.
        fate = (
            "they wait until one does"
            if self._grace is None
            else f"after UNKNOWN_NAME_GRACE, {self._grace}, they are dead-lettered as unknown_name"
        )
        for name in sorted(found.keys() - self._unknown_told):
            module = registry.undiscovered_module(name)
            cause = (
                f"its name says {module}, which the workers never import: they import the "
                "jobs.py (and tasks.py) modules of installed apps, so declare it there or "
                f"import {module} from one"
                if module
                else "restart the workers on code that registers it"
            )
            logger.warning(
                "worker %s: %d waiting job(s) named %r, which no live worker has a handler "
                "for: %s (%s)",
                self.host.id,
                found[name],
                name,
                cause,
                fate,
                extra={"job_name": name},
            )
        self._unknown_told = set(found)

    def _bury_unknown(self, name: str, since: datetime, before: datetime) -> None:
        message = (
            f"no live worker has known the name {name!r} since {since.isoformat()}; "
            f"dead-lettered after UNKNOWN_NAME_GRACE ({self._grace})"
        )
        store = JobStore(self.alias)
        deadline = time.monotonic() + PRUNE_BUDGET
        buried = 0
        while True:
            letters = store.dead_letter_unknown(
                name, before=before, message=message, worker=self.host.id, limit=UNKNOWN_BATCH
            )
            buried += len(letters)
            if signals.job_dead_lettered.receivers:
                for letter in letters:
                    signals.send(
                        signals.job_dead_lettered,
                        **signals.about(letter),
                        reason=letter.reason,
                        attempts=letter.attempts,
                        error=letter.error,
                    )
            if len(letters) < UNKNOWN_BATCH:
                break
            if time.monotonic() > deadline:
                self._next_unknown = 0.0  # more are left: go on at the next step
                break
        if buried:
            self.counters["dead_lettered_unknown"] += buried
            logger.warning(
                "worker %s: dead-lettered %d job(s) of %r as unknown_name: no live worker has "
                "known the name since %s (UNKNOWN_NAME_GRACE %s)",
                self.host.id,
                buried,
                name,
                since.isoformat(),
                self._grace,
            )

    def _refresh_schedules(self) -> None:
        now = ticker.db_now(self.alias)
        self._clock = (now, time.monotonic())
        self.ticker.refresh(now)

    def _prune(self, now: float) -> None:
        if self._windows:  # the only databases that count flow-control windows
            windows = FlowWindow.objects.using(self.alias).prune_ended()
            if windows:
                self.counters["pruned_flow_windows"] += windows
                logger.info("worker %s: pruned %d ended flow window(s)", self.host.id, windows)
        result = retention.prune(self.alias, budget=PRUNE_BUDGET)
        if result.markers or result.dead_letters:
            self._next_prune = now + self.interval
            self._pruned["django_jobs_marker"] += result.markers
            self._pruned["django_jobs_deadletter"] += result.dead_letters
            for table, pruned in self._pruned.items():
                if (
                    pruned >= VACUUM_AFTER_PRUNED
                    and self._vacuums
                    and not sql.autovacuum_on(self.alias)
                ):
                    # Nothing else would make the pruned rows' space reusable.
                    sql.vacuum(self.alias, table)
                    self._pruned[table] = 0
            self.counters["pruned_markers"] += result.markers
            self.counters["pruned_dead_letters"] += result.dead_letters
            logger.info(
                "worker %s: pruned %d marker(s), %d dead letter(s)",
                self.host.id,
                result.markers,
                result.dead_letters,
            )

    def _vacuum_jobs(self) -> None:
        if sql.dead_rows(self.alias, "django_jobs_job") > VACUUM_MIN_DEAD:
            started = time.monotonic()
            sql.vacuum(self.alias, "django_jobs_job")
            self.counters["vacuums"] += 1
            logger.info(
                "worker %s: vacuumed the jobs table (%.0f ms)",
                self.host.id,
                (time.monotonic() - started) * 1000,
            )

    def _prune_pause(self) -> float:
        """Seconds until the next round when this one finds nothing: no row can turn
        old sooner than the shortest retention, and ROW_REFRESH bounds the wait."""
        keeps = [
            keep.total_seconds()
            for keep in (
                retention.as_timedelta(conf.get(name))
                for name in ("KEEP_MARKERS", "KEEP_DEAD_LETTERS")
            )
            if keep is not None
        ]
        return min(ROW_REFRESH, max(self.interval, min(keeps, default=ROW_REFRESH)))

    def _db_now(self, mono: float) -> datetime:
        assert self._clock is not None  # callers check it first
        at, measured = self._clock
        return at + timedelta(seconds=mono - measured)
