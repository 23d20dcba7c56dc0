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

This module holds the specifications only (it imports no models); the
worker-side ticker and the schedule table's sync are django_jobs.worker.ticker.

Missed ticks: only the latest due tick is enqueued, once. A worker fleet that was
down through ten ticks enqueues one job when it comes back, not ten; the skipped
ticks are logged. A new schedule starts with its first tick after it was first
seen, and enabling a disabled schedule does not run the ticks it missed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_jobs import conf, limits, payloads
from django_jobs.exceptions import InvalidJob
from django_jobs.registry import Handler, P, R, check_priority

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
    # The job database whose workers tick it: "" for DJANGO_JOBS["DATABASE"], "*" for
    # every job database (a job per tick in each), else an alias of DATABASES.
    database: str = ""

    def fires_in(self, alias: str) -> bool:
        """Whether the workers of job database `alias` tick this schedule."""
        return self.database == "*" or (self.database or conf.database()) == alias

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
    database: str | None = None,
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
    if queue is not None:
        try:
            limits.queue_name(queue)
        except ValueError:
            raise InvalidSchedule(f"schedule {name!r}: invalid queue name {queue!r}") from None
    if priority is not None:
        try:
            check_priority(priority)
        except InvalidJob as exc:
            raise InvalidSchedule(f"schedule {name!r}: {exc}") from None
    if not isinstance(job, str) or not job:
        raise InvalidSchedule(f"schedule {name!r}: job must be the name of a @job handler")
    if database is not None and (not isinstance(database, str) or not database):
        raise InvalidSchedule(
            f"schedule {name!r}: database must be an alias of DJANGO_JOBS['DATABASES'] or "
            f"'*' (every one), not {limits.shown(database)}"
        )
    try:
        text = payloads.encode(payload)
    except InvalidJob as exc:
        raise InvalidSchedule(f"schedule {name!r}: {exc}") from None
    return ScheduleSpec(
        name=name,
        job=job,
        cron=cron or "",
        every=seconds,
        timezone=timezone,
        payload=text,
        queue=queue,
        priority=priority,
        database=database or "",
    )


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
    database: str | None = None,
) -> Callable[[Handler[P, R]], Handler[P, R]]:
    """Run the @job below on a schedule: a five-field cron expression, or every=seconds.

    ``name`` defaults to the job's name; ``payload``, ``queue`` and ``priority`` are
    those of every job the schedule enqueues. ``database``: the job database it fires
    in, once per tick (default DJANGO_JOBS["DATABASE"]; "*": in every one). Put it
    above ``@job``.
    """

    def decorate(handler: Handler[P, R]) -> Handler[P, R]:
        if not isinstance(handler, Handler):
            raise TypeError("@periodic goes above @job: it schedules a registered handler")
        spec = make_spec(
            name if name is not None else handler.name,
            job=handler.name,
            cron=cron,
            every=every,
            timezone=timezone,
            payload=payload,
            queue=queue,
            priority=priority,
            database=database,
        )
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
            "database",
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


def declared_in(alias: str) -> dict[str, ScheduleSpec]:
    """Return the declared schedules that fire in job database `alias`, by name."""
    return {name: spec for name, spec in declared().items() if spec.fires_in(alias)}


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "DJANGO_JOBS":
        _from_settings.cache_clear()
