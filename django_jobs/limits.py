"""The limits of every value django-jobs stores or waits on, and the checks that hold them.

One place: the models size their columns with these, and enqueue, @job, the
worker, the system checks and the command-line options validate against them,
before any SQL runs.
"""

from __future__ import annotations

import math
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
# Priority is a smallint with a check constraint.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
# Column lengths of job names, queue names and dedupe keys.
MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 100
MAX_KEY_LENGTH = 255
# PostgreSQL stores at most 1 GB in one text value.
MAX_PAYLOAD_BYTES = 2**30


def integer(
    what: str, value: Any, low: int, high: int, *, error: type[Exception] = ValueError
) -> int:
    """Return value if it is an int in [low, high], else raise error naming what and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{what} must be a whole number from {low} to {high}, not {shown(value)}")
    return value


def seconds(
    what: str, value: Any, *, zero: bool = False, error: type[Exception] = ValueError
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
        f"not {shown(value)}"
    )


def shown(value: Any, width: int = 60) -> str:
    """Return a short repr of value for an error message (huge ints and strings cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 1]}…"
