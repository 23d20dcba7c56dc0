"""The limits of every value django-jobs stores or waits on, and the checks that hold them.

One place: the models size their columns with these, and enqueue, @job, the
worker, the system checks and the command-line options validate against them,
before any SQL runs.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

# The longest duration any option takes (lease, heartbeat, grace, poll interval,
# timeout, delay, backoff, retention, snooze, schedule interval): ten years.
# PostgreSQL intervals (~178 million years) and timedelta (~2.7 million years)
# hold more, but now() plus the value must stay a date both can store.
MAX_SECONDS = 10 * 365 * 24 * 3600
# 32-bit integer columns (attempts, max_attempts); also the cap of counts
# (batch sizes, --max-jobs, --limit), far above any sensible value.
MAX_INT = 2**31 - 1
# Executor threads of one worker process, each with its own database connection.
MAX_CONCURRENCY = 1000
# Async handlers a worker's event loop runs at once (runjobs --async-concurrency).
MAX_ASYNC_CONCURRENCY = 10_000
# Priority is a smallint with a check constraint.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
# Column lengths of job names, queue names and dedupe keys.
MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 100
MAX_KEY_LENGTH = 255
# Schedule names (the schedule table's primary key).
MAX_SCHEDULE_LENGTH = 100
# Lease tokens ("<worker id>#<claim>") and worker ids.
MAX_TOKEN_LENGTH = 160
# Who paused a queue or replayed a letter (a username, as long as Django's).
MAX_BY_LENGTH = 150
# Why a queue was paused.
MAX_REASON_LENGTH = 200
# A payload fingerprint: a SHA-256 digest in hex.
FINGERPRINT_LENGTH = 64
# A job's trace context: a W3C traceparent (55 characters), a space and its
# tracestate, kept only when at most MAX_TRACESTATE_LENGTH (the W3C's own limit).
MAX_TRACESTATE_LENGTH = 512
MAX_TRACE_CONTEXT_LENGTH = 55 + 1 + MAX_TRACESTATE_LENGTH
# PostgreSQL stores at most 1 GB in one text value.
MAX_PAYLOAD_BYTES = 2**30
# How deep lists and objects may nest in a payload (a Task's arguments included) or a
# handler's result ({"a": [1]} is 2 deep). MariaDB's JSON columns refuse values 32 deep
# (10.11), and every engine holds the same rule. The admin masks and shows values this
# deep and does not show deeper ones (only a hand-written row holds one); json's own
# encoder and decoder give up near 1,000 levels, PostgreSQL's jsonb near 10,000.
MAX_NESTING = 30

# Run times (run_at at enqueue, a Task's run_after, a replay's run-at): years 1000 to
# 8999 in UTC. Nearer datetime.min or max, a time has no local time in some zones
# (year 1 in New York is year 0, which Python has not), so the admin could not show
# it; MariaDB's DATETIME starts at 1000; from 9000 on, run_at is the sentinel of a
# blocked workflow step (models.BLOCKED_UNTIL). Delays, snoozes, backoffs and
# schedule ticks are at most MAX_SECONDS from now, always inside.
EARLIEST_RUN_AT = datetime(1000, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(8999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)

# Job names default to dotted paths ("<locals>" appears in those of nested
# functions); queue names are plainer. Both are column values and log fields.
NAME_RE = re.compile(r"[A-Za-z_<][A-Za-z0-9_.:<>\-]*")
QUEUE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")


# What the patterns accept, said in their errors.
NAME_FORM = (
    "ASCII letters (A-Z, a-z), digits (0-9) and _ . : < > - only, starting with a letter, _ or <"
)
QUEUE_FORM = (
    "ASCII letters (A-Z, a-z), digits (0-9) and _ . : - only, starting with a letter, digit or _"
)


def job_name(value: Any, *, error: type[Exception] = ValueError) -> str:
    """Return value if it is a valid job name, else raise error saying why."""
    return _identifier("job name", value, NAME_RE, NAME_FORM, MAX_NAME_LENGTH, error)


def queue_name(value: Any, *, error: type[Exception] = ValueError) -> str:
    """Return value if it is a valid queue name, else raise error saying why."""
    return _identifier("queue", value, QUEUE_RE, QUEUE_FORM, MAX_QUEUE_LENGTH, error)


def _identifier(
    what: str,
    value: Any,
    pattern: re.Pattern[str],
    form: str,
    limit: int,
    error: type[Exception],
) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise error(f"{what} must not be empty")
    if len(value) > limit:
        raise error(f"{what} is {len(value)} characters long; the limit is {limit}")
    if not pattern.fullmatch(value):
        raise error(f"{what} {shown(value)} may hold {form}; no spaces or other characters")
    return value


def dedupe_key(value: Any, *, error: type[Exception] = ValueError) -> str:
    """Return value if it is a valid dedupe key (any printable text), else raise error."""
    if not isinstance(value, str):
        raise error(f"key must be a string, not {type(value).__name__}")
    if not value:
        raise error("key must not be empty (pass None for no key)")
    if len(value) > MAX_KEY_LENGTH:
        raise error(f"key is {len(value)} characters long; the limit is {MAX_KEY_LENGTH}")
    if not value.isprintable() or value != value.strip():
        raise error(
            f"key {value!r} must be printable, without control characters or surrounding spaces"
        )
    return value


def workflow_name(value: Any, *, error: type[Exception] = ValueError) -> str:
    """Return value if it is a valid workflow name (printable text, as a key), else raise error."""
    if not isinstance(value, str):
        raise error(f"workflow name must be a string, not {type(value).__name__}")
    if not value or len(value) > MAX_KEY_LENGTH:
        raise error(f"workflow name must be 1 to {MAX_KEY_LENGTH} characters, not {len(value)}")
    if not value.isprintable() or value != value.strip():
        raise error(
            f"workflow name {value!r} must be printable, without control characters or "
            "surrounding spaces"
        )
    return value


def integer(
    what: str, value: Any, low: int, high: int, *, error: type[Exception] = ValueError
) -> int:
    """Return value if it is an int in [low, high], else raise error naming what and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{what} must be a whole number from {low} to {high}, not {shown(value)}")
    return value


def seconds(
    what: str,
    value: Any,
    *,
    zero: bool = False,
    error: type[Exception] = ValueError,
    hint: str = "",
) -> float:
    """Return value as float seconds if it is a number in (0, MAX_SECONDS] ([0, ...] if zero)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float
            number = math.inf
        if (number > 0 or (zero and number == 0)) and number <= MAX_SECONDS:
            return number
    low = "from 0" if zero else "above 0"
    raise error(
        f"{what} must be a number of seconds {low} up to {MAX_SECONDS} (ten years), "
        f"not {shown(value)}{hint}"
    )


def run_time(what: str, value: Any, *, error: type[Exception] = ValueError) -> datetime:
    """Return value if it is a datetime from EARLIEST_RUN_AT to LATEST_RUN_AT, else raise error.

    A naive value (USE_TZ off) is compared as if it were UTC: a day either way
    is nothing at the edges of these years.
    """
    if not isinstance(value, datetime):
        raise error(f"{what} must be a datetime, not {type(value).__name__}")
    try:
        utc = value.astimezone(UTC) if value.utcoffset() is not None else value.replace(tzinfo=UTC)
    except OverflowError:  # its offset takes it past datetime.min or max
        utc = None
    if utc is None or not EARLIEST_RUN_AT <= utc <= LATEST_RUN_AT:
        raise error(
            f"{what} must be from {EARLIEST_RUN_AT:%Y-%m-%d} to {LATEST_RUN_AT:%Y-%m-%d} "
            f"(UTC), not {value.isoformat()}"
        )
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Text that means "no limit" where a duration may be None (a retention: keep everything).
_NEVER = frozenset({"none", "forever", "keep"})


def _seconds(value: Any) -> float | None:
    """The seconds a timedelta or a real number (not a bool) stands for; None for anything else."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def duration(value: Any, *, what: str = "the duration") -> timedelta | None:
    """Return None, a timedelta, seconds or text like '7d', '12h', '90m', '45' as a timedelta.

    The one duration parser: 'none' (or None) is None, anything else must come
    to 0 .. MAX_SECONDS; raise ValueError naming `what` otherwise.
    """
    if value is None:
        return None
    number = _seconds(value)
    if number is None and isinstance(value, str):
        if value.strip().lower() in _NEVER:
            return None
        match = _DURATION.match(value.lower())
        if not match:
            raise ValueError(
                f"{what} must be a duration like 7d, 12h, 30m or 90s, or 'none'; not {shown(value)}"
            )
        number = float(match[1]) * _UNIT[match[2]]
    elif number is None:
        raise ValueError(f"{what} must be None, seconds or a timedelta, not {shown(value)}")
    if not 0 <= number <= MAX_SECONDS:
        raise ValueError(
            f"{what} must be 0 to {MAX_SECONDS} seconds (ten years; 'none' keeps "
            f"everything), not {shown(value)}"
        )
    return timedelta(seconds=number)


def counted(*counts: tuple[int, str]) -> list[str]:
    """Return "3 waiting" for each (count, what) whose count is not 0, in their order."""
    return [f"{n} {what}" for n, what in counts if n]


def format_duration(value: timedelta | float) -> str:
    """Return a short human duration: 45s, 3m 4s, 42m, 3h 5m, 2d 4h (negative as positive)."""
    seconds = int(abs(value.total_seconds() if isinstance(value, timedelta) else value))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s" if minutes < 10 and seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def shown(value: Any, width: int = 60) -> str:
    """Return a short repr of value for an error message (huge ints and strings cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 1]}…"


# ctx.progress(): a note's length, and how often a running job's progress is written.
MAX_PROGRESS_NOTE = 200
PROGRESS_INTERVAL = 1.0  # seconds; values reported between writes wait for the next one


def _count(what: str, value: Any) -> float | int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float
            number = math.inf
        if 0 <= number < math.inf:  # NaN is neither
            return value if isinstance(value, int) and value <= 2**53 else number
    raise ValueError(f"progress: {what} must be a finite number from 0, not {shown(value)}")


def progress(done: Any, total: Any, note: Any) -> dict[str, Any]:
    """Return ctx.progress()'s arguments as the JSON stored with the job, else raise ValueError."""
    count = _count("done", done)
    whole = None if total is None else _count("total", total)
    if whole is not None and (whole == 0 or count > whole):
        raise ValueError(f"progress: done ({count}) must be at most total ({whole}), total above 0")
    if not isinstance(note, str):
        raise ValueError(f"progress: note must be text, not {type(note).__name__}")
    if len(note) > MAX_PROGRESS_NOTE or not note.isprintable():
        raise ValueError(
            f"progress: note must be printable text of at most {MAX_PROGRESS_NOTE} characters"
        )
    return {"done": count, "total": whole, "note": note}


# Tags and metadata of a job (enqueue(tags=..., meta=...), @job(tags=...)): a few short
# labels to filter by, not a second payload.
MAX_TAGS = 16
MAX_TAG_LENGTH = 64
MAX_META_KEYS = 16
MAX_META_KEY_LENGTH = 64
MAX_META_VALUE_LENGTH = 200
# Keys are names (a JSON path of every engine quotes them alike; "=" separates the
# admin's key=value filter).
META_KEY_RE = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_META_KEY_LENGTH}}}")


def _label(what: str, value: Any, limit: int, error: type[Exception]) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not value.isprintable():
        raise error(f"{what} must be printable text of 1 to {limit} characters, not {shown(value)}")
    return value


def tags(value: Any, *, error: type[Exception] = ValueError) -> list[str]:
    """Return value as a sorted list of distinct tags, or raise error."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
        raise error(f"tags must be a list of strings, not {shown(value)}")
    found = sorted({_label("a tag", tag, MAX_TAG_LENGTH, error) for tag in value})
    if len(found) > MAX_TAGS:
        raise error(f"a job takes at most {MAX_TAGS} tags, not {len(found)}")
    return found


def meta(value: Any, *, error: type[Exception] = ValueError) -> dict[str, str]:
    """Return value as a dict of text keys to text values, or raise error."""
    if not isinstance(value, dict):
        raise error(f"meta must be a dict of strings to strings, not {shown(value)}")
    if len(value) > MAX_META_KEYS:
        raise error(f"meta takes at most {MAX_META_KEYS} keys, not {len(value)}")
    for key in value:
        if not isinstance(key, str) or not META_KEY_RE.fullmatch(key):
            raise error(
                f"a meta key must be 1 to {MAX_META_KEY_LENGTH} letters, digits and _ . : -, "
                f"not {shown(key)}"
            )
    return {key: _meta_value(key, item, error) for key, item in sorted(value.items())}


def _meta_value(key: str, value: Any, error: type[Exception]) -> str:
    if not isinstance(value, str) or len(value) > MAX_META_VALUE_LENGTH or not value.isprintable():
        raise error(
            f"meta[{key!r}] must be printable text of at most {MAX_META_VALUE_LENGTH} "
            f"characters, not {shown(value)}"
        )
    return value


def priority_aging(value: Any) -> float | None:
    """Return DJANGO_JOBS["PRIORITY_AGING"] as seconds per priority step, None for off.

    None (off), a number of seconds or a timedelta, from 1 second to MAX_SECONDS;
    raise ValueError otherwise.
    """
    if value is None:
        return None
    number = _seconds(value)
    if number is None:
        raise ValueError(
            "DJANGO_JOBS['PRIORITY_AGING'] must be None, seconds per priority step or a "
            f"timedelta, not {shown(value)}"
        )
    if not 1 <= number <= MAX_SECONDS:  # NaN fails too
        raise ValueError(
            f"DJANGO_JOBS['PRIORITY_AGING'] must be 1 to {MAX_SECONDS} seconds per priority "
            f"step, not {shown(value)}"
        )
    return float(number)
