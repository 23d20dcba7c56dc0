"""A worker's maintenance: paused queues, schedule ticks, its heartbeat row, pruning, counters.

``Worker`` builds one ``WorkerOps`` and calls it from a few marked places in its
dispatcher loop; everything here runs on the dispatcher's connection, never per
job:

- once per poll interval: reload the set of paused queues (one query), which the
  claim then leaves out;
- once per MAINTENANCE_INTERVAL: upsert this worker's heartbeat row (with its
  counters), reload the schedules, prune one time-boxed round of old markers and
  dead letters, and forget workers whose rows went stale;
- when a schedule's next tick is due (estimated from the database clock measured
  at the last maintenance): try to take the tick and enqueue its job;
- at each lease heartbeat: look up cancellation requests of the jobs it holds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models.functions import Now
from django.utils import timezone

from django_jobs import conf, control, retention, schedules

if TYPE_CHECKING:
    from django_jobs.models import ClaimedJob
    from django_jobs.worker import Worker

logger = logging.getLogger("django_jobs.worker")

# Upper bounds (seconds) of the job duration histogram's buckets.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Longest a maintenance step may spend pruning before it returns to the jobs.
PRUNE_BUDGET = 0.25


class WorkerOps:
    """The operational side of one Worker. Every method runs on the dispatcher thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.alias = worker.database
        self.interval = float(conf.get("MAINTENANCE_INTERVAL"))
        self.paused: set[str] = set()
        self._active = list(worker.queues)
        self._next_control = 0.0
        self._next_maintenance = 0.0
        self._clock: tuple[datetime, float] | None = None  # (database time, monotonic time)
        self._ready = False
        self.ticker = schedules.Ticker(self.alias)
        self.counters: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # job_finished outcomes
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.started_at = timezone.now()

    # ---- hooks the worker calls ------------------------------------------------

    def active_queues(self) -> list[str]:
        """The worker's queues less the paused ones: what the claim may take."""
        return self._active

    def tick(self, now: float) -> None:
        """Run whatever maintenance is due at monotonic time `now` (cheap when nothing is)."""
        if now >= self._next_control:
            self._next_control = now + self.worker.poll_interval
            self._step(self._refresh_paused)
        if now >= self._next_maintenance:
            self._next_maintenance = now + self.interval
            self._step(self._maintain)
        due = self.ticker.next_due
        if due is not None and self._clock is not None and self._db_now(now) >= due:
            self._step(lambda: self.ticker.run_due(self._db_now(time.monotonic())))

    def cancellations(self, job_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Ids among job_ids whose cancellation was requested (one query; empty on error)."""
        found = self.worker._db(lambda: control.cancel_requested(self.alias, job_ids))
        return found or set()

    def started(self, job: ClaimedJob) -> None:
        self.counters["started"] += 1
        last = job.errors[-1] if job.errors else None
        if last and last.get("type") == "django_jobs.LeaseExpired" and last.get("attempt") == job.attempts - 1:
            self.counters["rescued"] += 1  # its previous attempt's worker vanished: a re-execution

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

    def stopped(self) -> None:
        """Remove this worker's heartbeat row (a clean exit is not a dead worker)."""
        from django_jobs.models import WorkerBeat

        self.worker._db(lambda: WorkerBeat.objects.using(self.alias).filter(id=self.worker.id).delete())

    # ---- the steps -------------------------------------------------------------

    def _step(self, operation: Any) -> None:
        # Maintenance must never stop a worker from running jobs: a failure here is
        # logged and tried again at the next step. Connection errors are handled
        # (and the connection replaced) by Worker._db.
        try:
            self.worker._db(operation)
        except Exception:  # noqa: BLE001
            logger.exception("worker %s: maintenance step failed; trying again later", self.worker.id)

    def _refresh_paused(self) -> None:
        paused = control.paused_queues(self.alias)
        if paused != self.paused:
            stopped = sorted(set(self.worker.queues) & (paused - self.paused))
            restarted = sorted(set(self.worker.queues) & (self.paused - paused))
            if stopped:
                logger.warning("worker %s: queue(s) %s paused; not claiming from them", self.worker.id, ", ".join(stopped))
            if restarted:
                logger.info("worker %s: queue(s) %s resumed", self.worker.id, ", ".join(restarted))
                self.worker._more = True
            self.paused = paused
            self._active = [q for q in self.worker.queues if q not in paused]

    def _maintain(self) -> None:
        from django_jobs.models import QueueState

        if not self._ready:
            QueueState.objects.using(self.alias).ensure(self.worker.queues)
            schedules.sync(self.alias)
            self._ready = True
        mono = time.monotonic()
        now = schedules.db_now(self.alias)
        self._clock = (now, mono)
        self._beat()
        self.ticker.refresh(now)
        result = retention.prune(self.alias, budget=PRUNE_BUDGET)
        if result.markers or result.dead_letters:
            self.counters["pruned_markers"] += result.markers
            self.counters["pruned_dead_letters"] += result.dead_letters
            logger.info("worker %s: pruned %d marker(s), %d dead letter(s)",
                        self.worker.id, result.markers, result.dead_letters)  # fmt: skip

    def _beat(self) -> None:
        from django_jobs.models import WorkerBeat

        rows = WorkerBeat.objects.using(self.alias)
        values = {"running": len(self.worker._running), "stats": self.snapshot(), "queues": self.worker.queues}
        if not rows.filter(id=self.worker.id).update(last_seen_at=Now(), **values):
            rows.create(
                id=self.worker.id, host=socket.gethostname()[:255], pid=os.getpid(),
                concurrency=self.worker.concurrency, started_at=self.started_at,
                last_seen_at=timezone.now(), **values,
            )  # fmt: skip
        # Rows of workers that died without a word: keep them a while for `jobs status`, then drop.
        expiry = timedelta(seconds=10 * float(conf.get("WORKER_EXPIRY")))
        rows.filter(last_seen_at__lt=Now() - expiry).delete()

    def snapshot(self) -> dict[str, Any]:
        """Counters since start, as stored in the heartbeat row (read by the metrics view)."""
        return {
            **dataclasses.asdict(self.worker.stats),
            **self.counters,
            "outcomes": dict(self.outcomes),
            "scheduled": self.ticker.enqueued,
            "duration_buckets": list(self.durations),
            "duration_sum": self.duration_sum,
        }

    def _db_now(self, mono: float) -> datetime:
        at, measured = self._clock
        return at + timedelta(seconds=mono - measured)
