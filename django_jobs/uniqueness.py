"""Unique for a period (docs/enqueue.md#unique-for-a-period): at most one job per key and period.

A job enqueued with ``unique_for`` gets a dedupe key made of its base key and the
start of the period it is enqueued in: periods are aligned to the epoch (a
``timedelta(minutes=5)`` period runs 12:00:00 to 12:04:59, then 12:05:00 ...), as
River's ``ByPeriod``. The base key is the ``key=`` given, or one derived from the
handler's name and the payload (the keys ``unique_by`` names, else all of it).
The database's uniqueness of dedupe keys (a live job's key, a completion marker's)
then makes the second enqueue of a period a duplicate, race-free on every engine:
no new statement, no new table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django_jobs import limits
from django_jobs import payloads as codec
from django_jobs.exceptions import InvalidJob

# A period longer than a year is a configuration mistake, not a dedupe window.
MAX_PERIOD = timedelta(days=366)
# "@" and the period's start, 2026-12-02T05:35:00Z: what a key gets appended.
_SUFFIX_LENGTH = 21


def check_period(value: object) -> timedelta:
    """Return value if it is a valid unique_for period (a timedelta of whole seconds, from
    one second to MAX_PERIOD), else raise InvalidJob."""
    if not isinstance(value, timedelta):
        raise InvalidJob(f"unique_for must be a timedelta, not {limits.shown(value)}")
    if value.microseconds or value < timedelta(seconds=1) or value > MAX_PERIOD:
        raise InvalidJob(
            f"unique_for must be whole seconds from 1 second to {MAX_PERIOD.days} days, "
            f"not {value!r}"
        )
    return value


def check_unique_by(value: object) -> tuple[str, ...]:
    """Return value as a tuple if it names payload keys (a list or tuple of distinct,
    non-empty strings), else raise InvalidJob."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidJob(
            f'unique_by must be a tuple of payload keys, such as ("customer_id",), '
            f"not {limits.shown(value)}"
        )
    names = tuple(value)
    if not names:
        raise InvalidJob("unique_by must name at least one payload key")
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidJob(f"unique_by holds {limits.shown(name)}: payload keys are strings")
    if len(set(names)) != len(names):
        raise InvalidJob(f"unique_by names a key twice: {names!r}")
    return names


def options(
    unique_for: object, unique_by: object, key: object = None
) -> tuple[timedelta | None, tuple[str, ...] | None]:
    """Validate a declaration's or a call's unique_for and unique_by together."""
    period = None if unique_for is None else check_period(unique_for)
    by = None if unique_by is None else check_unique_by(unique_by)
    if by is not None and period is None:
        raise InvalidJob("unique_by needs unique_for: the period the payload keys are unique for")
    if by is not None and key is not None:
        raise InvalidJob("pass key= or unique_by, not both: key= is the unique key itself")
    return period, by


def period_start(period: timedelta, now: datetime) -> datetime:
    """The start of the period (aligned to the epoch) that holds now."""
    seconds = int(period.total_seconds())
    stamp = int(now.timestamp())
    return datetime.fromtimestamp(stamp - stamp % seconds, UTC)


def keyed(
    name: str,
    payload: Any,
    text: str,
    key: str | None,
    period: timedelta,
    unique_by: Iterable[str] | None,
    now: datetime,
    blind: Callable[[str], str] | None = None,
) -> tuple[str, str]:
    """Return the dedupe key and fingerprint of a job unique for `period`, enqueued at now.

    With `key` (already validated), the key is it plus the period's start and the
    fingerprint is the whole payload's (as for any key: another payload with the
    same key is an IdempotencyConflict). Without, both come from the handler's name
    and the payload's `unique_by` keys (all of it when None): payloads that differ
    elsewhere are duplicates of each other. `blind` (an encrypting handler's) keys the
    digest a derived key shows: a plain digest of the payload would let a reader of
    the row test guessed values (an SSN) by hashing them.
    """
    suffix = "@" + period_start(period, now).strftime("%Y-%m-%dT%H:%M:%SZ")
    if key is not None:
        if len(key) + _SUFFIX_LENGTH > limits.MAX_KEY_LENGTH:
            raise InvalidJob(
                f"key is {len(key)} characters long; with unique_for the limit is "
                f"{limits.MAX_KEY_LENGTH - _SUFFIX_LENGTH} (the period's start is appended)"
            )
        return key + suffix, codec.fingerprint(name, text)
    if unique_by is not None:
        if not isinstance(payload, dict):
            raise InvalidJob(
                f"unique_by needs a dict payload to take its keys from, "
                f"not {type(payload).__name__}"
            )
        missing = [field for field in unique_by if field not in payload]
        if missing:
            raise InvalidJob(f"unique_by names keys the payload lacks: {', '.join(missing)}")
        text = codec.encode({field: payload[field] for field in unique_by})
    digest = codec.fingerprint(name, text)
    shown = digest if blind is None else blind(digest)
    base = f"{name}:{shown[:32]}"
    if len(base) + _SUFFIX_LENGTH > limits.MAX_KEY_LENGTH:
        base = shown
    return base + suffix, digest
