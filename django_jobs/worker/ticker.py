"""The worker side of schedules: sync the declared schedules to their table, take due ticks.

The specifications (cron, intervals, @periodic, the SCHEDULES setting) are
django_jobs.schedules; how a tick becomes exactly one job is told there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from django.db import DatabaseError, transaction
from django.utils import timezone as dj_timezone

from django_jobs import conf, registry
from django_jobs.api import enqueue
from django_jobs.exceptions import JobsError
from django_jobs.models import Schedule
from django_jobs.schedules import ScheduleSpec, declared_in
from django_jobs.store import JobStore

# The name operators filter on since schedules began.
logger = logging.getLogger("django_jobs.schedules")


def db_now(alias: str) -> datetime:
    """Return the database's clock (aware, UTC); SQLite shares the host's."""
    return JobStore(alias).clock()


def _definition(spec: ScheduleSpec) -> dict[str, Any]:
    """The columns of a schedule's row that its declaration sets."""
    return {
        "cron": spec.cron,
        "every": spec.every,
        "timezone": spec.timezone,
        "job_name": spec.job,
        "payload": spec.payload,
        "queue": spec.queue,
        "priority": spec.priority,
    }


def sync(alias: str | None = None) -> dict[str, ScheduleSpec]:
    """Write the declared definitions to the schedule table; mark vanished ones undeclared.

    ``enabled`` and the tick state are left alone: they belong to the database.
    """
    alias = alias or conf.database()
    specs = declared_in(alias)
    rows = Schedule.objects.using(alias)
    with transaction.atomic(using=alias):
        rows.bulk_create(
            [Schedule(name=s.name, **_definition(s)) for s in specs.values()],
            ignore_conflicts=True,
        )
        for spec in specs.values():
            # Rewrite only rows whose definition differs (NOT (a AND b ...)), so that
            # workers starting together do not queue up on the same rows.
            changed = rows.filter(name=spec.name).exclude(
                declared=True, **_nullable(**_definition(spec))
            )
            changed.update(**_definition(spec), declared=True, updated_at=dj_timezone.now())
        rows.filter(declared=True).exclude(name__in=list(specs)).update(declared=False)
    return specs


def _nullable(**values: Any) -> dict[str, Any]:
    # exclude(queue=None) would compare with = NULL; ask for IS NULL instead.
    return {
        (f"{k}__isnull" if v is None else k): (True if v is None else v) for k, v in values.items()
    }


@dataclass(slots=True)
class _State:
    spec: ScheduleSpec
    enabled: bool
    created_at: datetime
    last_tick_at: datetime | None


class Ticker:
    """A worker's view of the schedules: enqueue each due tick once across all workers."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.states: dict[str, _State] = {}
        self.next_due: datetime | None = None
        self.enqueued = 0

    def refresh(self, now: datetime) -> None:
        """Reload enabled flags and tick state; compute when the next tick is due."""
        specs = declared_in(self.alias)
        self.states = {}
        rows = Schedule.objects.using(self.alias).filter(name__in=list(specs), declared=True)
        for name, enabled, created_at, last_tick_at in rows.values_list(
            "name", "enabled", "created_at", "last_tick_at"
        ):
            self.states[name] = _State(
                specs[name], enabled, _aware(created_at), _aware(last_tick_at)
            )
        self._plan(now)

    def _plan(self, now: datetime) -> None:
        upcoming = [s.spec.next_tick(now) for s in self.states.values() if s.enabled]
        due_now = any(self._due(s, now) for s in self.states.values())
        self.next_due = now if due_now else min(upcoming, default=None)

    def _due(self, state: _State, now: datetime) -> datetime | None:
        if not state.enabled:
            return None
        tick = state.spec.previous_tick(now)
        if state.last_tick_at is None:
            # A new schedule starts with its first tick after it was created.
            return tick if tick >= state.created_at else None
        return tick if tick > state.last_tick_at else None

    def run_due(self, now: datetime) -> int:
        """Enqueue the due tick of each schedule whose tick no other worker took.

        Return how many were enqueued.
        """
        count = 0
        for state in self.states.values():
            tick = self._due(state, now)
            if tick is None:
                continue
            spec = state.spec
            if registry.lookup(spec.job) is None:
                logger.error(
                    "schedule %s: no handler named %r in this worker; tick skipped",
                    spec.name,
                    spec.job,
                )
                continue
            try:
                with transaction.atomic(using=self.alias):
                    if not Schedule.objects.using(self.alias).take_tick(spec.name, tick):
                        state.last_tick_at = tick  # another worker has it
                        continue
                    result = enqueue(
                        spec.job,
                        json.loads(spec.payload),
                        key=spec.key(tick),
                        run_at=tick,
                        queue=spec.queue,
                        priority=spec.priority,
                        using=self.alias,
                    )
                    Schedule.objects.using(self.alias).note_job(spec.name, result.id)
            except (JobsError, DatabaseError) as exc:
                logger.error(
                    "schedule %s: could not enqueue the tick of %s: %s", spec.name, tick, exc
                )
                if isinstance(exc, DatabaseError) and not isinstance(exc, JobsError):
                    raise
                continue
            missed = self._missed(state, tick)
            state.last_tick_at = tick
            count += 1
            logger.info(
                "schedule %s: enqueued job %s for tick %s%s",
                spec.name,
                result.id,
                tick.isoformat(),
                f" ({missed} earlier missed tick(s) skipped)" if missed else "",
            )
        self.enqueued += count
        self._plan(now)
        return count

    def _missed(self, state: _State, tick: datetime) -> int:
        if state.last_tick_at is None:
            return 0
        missed, at = 0, state.last_tick_at
        while missed < 1000:
            at = state.spec.next_tick(at)
            if at >= tick:
                break
            missed += 1
        return missed


@overload
def _aware(value: datetime) -> datetime: ...
@overload
def _aware(value: None) -> None: ...
def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if dj_timezone.is_naive(value):
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
