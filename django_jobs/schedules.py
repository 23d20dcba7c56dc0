"""Periodic jobs: cron (or fixed-interval) schedules that every worker ticks, with no leader.

Declare one next to its handler::

    @periodic("0 3 * * *", timezone="Europe/Paris", payload={"kind": "nightly"})
    @job
    def nightly_report(payload, ctx): ...

or in settings::

    DJANGO_JOBS = {"SCHEDULES": {
        "nightly-report": {"cron": "0 3 * * *", "job": "shop.jobs.nightly_report",
                           "timezone": "Europe/Paris", "payload": {"kind": "nightly"}},
    }}

How a tick becomes exactly one job, whatever the number of workers: each worker
computes the latest tick due (on the database clock) and tries to record it on
the schedule's row with a compare-and-set (``Schedule.objects.take_tick``); the
one worker whose update succeeds enqueues the job in the same transaction, with
the dedupe key ``schedule:<name>:<tick>`` as a second lock (the unique index on
live keys and the completion markers). The others change nothing.

Missed ticks: only the latest due tick is enqueued, once. A worker fleet that was
down through ten ticks enqueues one job when it comes back, not ten; the skipped
ticks are logged. A new schedule starts with its first tick after it was first
seen, and enabling a disabled schedule does not run the ticks it missed.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import DatabaseError, connections, transaction
from django.utils import timezone as dj_timezone

from django_jobs import conf, limits, payloads
from django_jobs.exceptions import InvalidJob, JobsError
from django_jobs.limits import MAX_QUEUE_LENGTH
from django_jobs.registry import QUEUE_RE, Handler, P, R, check_priority

logger = logging.getLogger(__name__)

MAX_SCHEDULE_NAME = limits.MAX_SCHEDULE_LENGTH  # kept for imports
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidSchedule(InvalidJob):
    """A schedule's definition is invalid (cron, timezone, payload, options)."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as the code declares it."""

    name: str
    job: str
    cron: str = ""
    every: int | None = None
    timezone: str = "UTC"
    payload: str = "null"  # JSON text
    queue: str | None = None
    priority: int | None = None

    def previous_tick(self, now: datetime) -> datetime:
        """Return the latest tick at or before `now` (aware, UTC)."""
        if self.every:
            seconds = math.floor((now - _EPOCH).total_seconds() / self.every) * self.every
            return _EPOCH + timedelta(seconds=seconds)
        local = now.astimezone(ZoneInfo(self.timezone)) + timedelta(microseconds=1)
        return next(CronSim(self.cron, local, reverse=True)).astimezone(UTC)

    def next_tick(self, now: datetime) -> datetime:
        """Return the first tick strictly after `now` (aware, UTC)."""
        if self.every:
            return self.previous_tick(now) + timedelta(seconds=self.every)
        local = now.astimezone(ZoneInfo(self.timezone))
        return next(CronSim(self.cron, local)).astimezone(UTC)

    def key(self, tick: datetime) -> str:
        return f"schedule:{self.name}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"

    def describe(self) -> str:
        return f"every {self.every}s" if self.every else f"{self.cron} ({self.timezone})"


def make_spec(
    name: str,
    *,
    job: str,
    cron: str | None = None,
    every: int | float | timedelta | None = None,
    timezone: str = "UTC",
    payload: Any = None,
    queue: str | None = None,
    priority: int | None = None,
) -> ScheduleSpec:
    """Validate a schedule's definition and return it; raise InvalidSchedule naming the problem."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_SCHEDULE_NAME
        or not name.isprintable()
        or name != name.strip()
    ):
        raise InvalidSchedule(
            f"schedule name must be 1 to {MAX_SCHEDULE_NAME} printable characters, not {name!r}"
        )
    if (cron is None) == (every is None):
        raise InvalidSchedule(f"schedule {name!r} needs either a cron expression or every=seconds")
    if not isinstance(timezone, str):
        raise InvalidSchedule(f"schedule {name!r}: timezone must be a name like 'Europe/Paris'")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f"schedule {name!r}: unknown timezone {timezone!r}") from None
    seconds: int | None = None
    if cron is not None:
        if not isinstance(cron, str) or len(cron.split()) != 5:
            raise InvalidSchedule(
                f"schedule {name!r}: cron must be a standard five-field expression "
                f"(minute hour day-of-month month day-of-week), not {cron!r}"
            )
        cron = " ".join(cron.split())
        try:
            CronSim(cron, datetime.now(ZoneInfo(timezone)))
        except CronSimError as exc:
            raise InvalidSchedule(
                f"schedule {name!r}: invalid cron expression {cron!r}: {exc}"
            ) from None
    else:
        value = every.total_seconds() if isinstance(every, timedelta) else every
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 1 <= value <= limits.MAX_SECONDS
            or value != int(value)
        ):
            raise InvalidSchedule(
                f"schedule {name!r}: every must be a whole number of seconds from 1 to "
                f"{limits.MAX_SECONDS} (ten years), not {limits.shown(every)}"
            )
        seconds = int(value)
    if queue is not None and (
        not isinstance(queue, str) or len(queue) > MAX_QUEUE_LENGTH or not QUEUE_RE.fullmatch(queue)
    ):
        raise InvalidSchedule(f"schedule {name!r}: invalid queue name {queue!r}")
    if priority is not None:
        try:
            check_priority(priority)
        except InvalidJob as exc:
            raise InvalidSchedule(f"schedule {name!r}: {exc}") from None
    if not isinstance(job, str) or not job:
        raise InvalidSchedule(f"schedule {name!r}: job must be the name of a @job handler")
    try:
        text = payloads.encode(payload)
    except InvalidJob as exc:
        raise InvalidSchedule(f"schedule {name!r}: {exc}") from None
    return ScheduleSpec(
        name=name, job=job, cron=cron or "", every=seconds, timezone=timezone,
        payload=text, queue=queue, priority=priority,
    )  # fmt: skip


# ---- declarations ------------------------------------------------------------

_declared: dict[str, ScheduleSpec] = {}


def periodic(
    cron: str | None = None,
    *,
    every: int | float | timedelta | None = None,
    name: str | None = None,
    timezone: str = "UTC",
    payload: Any = None,
    queue: str | None = None,
    priority: int | None = None,
) -> Callable[[Handler[P, R]], Handler[P, R]]:
    """Run the @job below on a schedule: a five-field cron expression, or every=seconds.

    ``name`` defaults to the job's name; ``payload``, ``queue`` and ``priority`` are
    those of every job the schedule enqueues. Put it above ``@job``.
    """

    def decorate(handler: Handler[P, R]) -> Handler[P, R]:
        if not isinstance(handler, Handler):
            raise TypeError("@periodic goes above @job: it schedules a registered handler")
        spec = make_spec(
            name if name is not None else handler.name,
            job=handler.name, cron=cron, every=every, timezone=timezone,
            payload=payload, queue=queue, priority=priority,
        )  # fmt: skip
        existing = _declared.get(spec.name)
        if existing is not None and existing != spec:
            raise InvalidSchedule(
                f"schedule {spec.name!r} is declared twice with different definitions"
            )
        _declared[spec.name] = spec
        return handler

    return decorate


def undeclare(name: str) -> None:
    """Forget a schedule declared with @periodic (for tests)."""
    _declared.pop(name, None)


@cache
def _from_settings() -> tuple[ScheduleSpec, ...]:
    raw = conf.get("SCHEDULES") or {}
    if not isinstance(raw, dict):
        raise InvalidSchedule("DJANGO_JOBS['SCHEDULES'] must be a dict of name -> definition")
    specs = []
    for name, definition in raw.items():
        if not isinstance(definition, dict):
            raise InvalidSchedule(f"schedule {name!r}: its definition must be a dict")
        unknown = set(definition) - {
            "cron",
            "every",
            "job",
            "timezone",
            "payload",
            "queue",
            "priority",
        }
        if unknown:
            raise InvalidSchedule(f"schedule {name!r}: unknown options {sorted(unknown)}")
        if "job" not in definition:
            raise InvalidSchedule(f"schedule {name!r}: 'job' (the handler's name) is required")
        specs.append(make_spec(name, **definition))
    return tuple(specs)


def declared() -> dict[str, ScheduleSpec]:
    """Return every schedule declared in settings or with @periodic, by name."""
    specs = dict(_declared)
    for spec in _from_settings():
        if spec.name in specs and specs[spec.name] != spec:
            raise InvalidSchedule(
                f"schedule {spec.name!r} is declared both in settings and with @periodic"
            )
        specs[spec.name] = spec
    return specs


# ---- the database side -----------------------------------------------------------


def db_now(alias: str) -> datetime:
    """Return the database's clock (aware, UTC); SQLite shares the host's."""
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            now: datetime = cursor.fetchone()[0]
            return now.astimezone(UTC)
    return datetime.now(UTC)


def sync(alias: str | None = None) -> dict[str, ScheduleSpec]:
    """Write the declared definitions to the schedule table; mark vanished ones undeclared.

    ``enabled`` and the tick state are left alone: they belong to the database.
    """
    from django_jobs.models import Schedule

    alias = alias or conf.database()
    specs = declared()
    rows = Schedule.objects.using(alias)
    with transaction.atomic(using=alias):
        rows.bulk_create(
            [
                Schedule(name=s.name, cron=s.cron, every=s.every, timezone=s.timezone,
                         job_name=s.job, payload=s.payload, queue=s.queue, priority=s.priority)
                for s in specs.values()
            ],
            ignore_conflicts=True,
        )  # fmt: skip
        for spec in specs.values():
            # Rewrite only rows whose definition differs (NOT (a AND b ...)), so that
            # workers starting together do not queue up on the same rows.
            same = _nullable(
                cron=spec.cron, every=spec.every, queue=spec.queue, priority=spec.priority
            )
            changed = rows.filter(name=spec.name).exclude(
                timezone=spec.timezone,
                job_name=spec.job,
                payload=spec.payload,
                declared=True,
                **same,
            )
            changed.update(
                cron=spec.cron, every=spec.every, timezone=spec.timezone, job_name=spec.job,
                payload=spec.payload, queue=spec.queue, priority=spec.priority, declared=True,
                updated_at=dj_timezone.now(),
            )  # fmt: skip
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
        from django_jobs.models import Schedule

        specs = declared()
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
        from django_jobs import registry
        from django_jobs.api import enqueue
        from django_jobs.models import Schedule

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
                        spec.job, json.loads(spec.payload), key=spec.key(tick), run_at=tick,
                        queue=spec.queue, priority=spec.priority,
                    )  # fmt: skip
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
                spec.name, result.id, tick.isoformat(),
                f" ({missed} earlier missed tick(s) skipped)" if missed else "",
            )  # fmt: skip
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


def clear_caches() -> None:
    _from_settings.cache_clear()
