"""Flow control: limits that hold across the fleet (global concurrency, rate limits, partitions).

Pure values and their validation; the claim enforces them (sql.CLAIM_LIMITED,
store/postgres.py, Postgres.claim_flow) and docs/flow-control.md says how.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django_jobs import limits
from django_jobs.exceptions import InvalidJob
from django_jobs.payloads import safe_str

# The longest partition value stored with a job (the partition column).
MAX_PARTITION_LENGTH = 200
# Claimable rows of one limited group that one claim ranks, at most: a bound on
# the claim's cost whatever the backlog (partitions beyond them wait a claim).
SCAN = 1000

WINDOWS = {"s": 1, "m": 60, "h": 3600}
# The NOTIFY payload that says a slot of a group freed: this prefix, then the group's
# key. A queue name cannot hold a space, so no worker takes it for a queue's wake-up
# (nor does one of a release before it, which then waits for its poll as before).
FREED = "flow freed "
# Each claim adds its starts to a counter of every window length (Limit.counter:
# one row per group, partition and length), so that a claim counts, in its own
# window, the starts of workers whose limit has another unit: during a rolling
# deploy that changes "10/m" to "5/s", each worker is held to its own limit over
# every start of the fleet. The group's plain key is the one counter of the releases
# before these (in the claimer's own window): still written and read, so that
# workers of both releases count each other's starts while the deploy runs.
COUNTED_WINDOWS = tuple(WINDOWS.values())
# A window counter whose window started this long ago (the longest window, an
# hour, and an hour's margin) is pruned by the workers' upkeep.
KEEP_ENDED_WINDOWS = timedelta(seconds=2 * max(WINDOWS.values()))
# How a rate limit counts: in fixed windows aligned to the epoch (the default: one
# counter row per group, but 2N can start within one window's length, across a
# boundary), or in a sliding window (no interval of the window's length ever holds
# more than N starts: a log of each claim's starts, one row per claim, read over the
# last window and pruned by the claims once older than the longest window).
RATE_WINDOWS = ("fixed", "sliding")
KEEP_STARTS = max(WINDOWS.values())  # seconds
# Exactly the form the docs show: "100/m". ASCII digits (\d would take "５"), no
# spaces, no leading zeros ("0/s" matches, to be refused by its range).
_RATE_RE = re.compile(r"(0|[1-9][0-9]*)/([smh])")
# What a partition value may not hold: control characters (C0, DEL, C1) and line or
# paragraph separators, which would break the lines of logs and `jobs status`, and
# lone surrogates, which no database stores. Any other text is a partition value:
# any script, spaces of every kind (NBSP), zero-width and other format characters
# (the joiner inside an emoji sequence).
_NOT_IN_PARTITION = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
NOT_IN_PARTITION = (
    "control characters (U+0000-U+001F, U+007F-U+009F), line and paragraph "
    "separators (U+2028, U+2029) and lone surrogates"
)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` starts per fixed window of `seconds` (per sliding one if `sliding`)."""

    count: int
    seconds: int
    sliding: bool = False

    def __str__(self) -> str:
        unit = next(u for u, s in WINDOWS.items() if s == self.seconds)
        return f"{self.count}/{unit}"


def parse_rate(
    value: object, *, what: str = "rate_limit", window: object = None, what_window: str = ""
) -> Rate:
    """Return value ("100/m": N/s, N/m or N/h) as a Rate, else raise InvalidJob.

    `window` ("fixed", the default, or "sliding") says how it counts; a window
    given without a rate (value None) is refused.
    """
    sliding = check_window(window, what=what_window or "rate_window")
    if value is None and window is not None:
        raise InvalidJob(f"{what_window or 'rate_window'}={window!r} needs a {what} to count")
    if isinstance(value, Rate):
        return Rate(value.count, value.seconds, sliding) if window is not None else value
    match = _RATE_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidJob(
            f"{what} must be a string 'N/s', 'N/m' or 'N/h' (N starts per second, "
            f"minute or hour; N in ASCII digits, no spaces, as in '100/m'), "
            f"not {limits.shown(value)}"
        )
    count = limits.integer(f"{what}'s N", int(match[1]), 1, limits.MAX_INT, error=InvalidJob)
    return Rate(count, WINDOWS[match[2]], sliding)


def check_window(value: object, *, what: str = "rate_window") -> bool:
    """Return whether value (None or one of RATE_WINDOWS) is "sliding", else raise InvalidJob."""
    if value is None or (isinstance(value, str) and value in RATE_WINDOWS):
        return value == "sliding"
    raise InvalidJob(f"{what} must be 'fixed' or 'sliding', not {limits.shown(value)}")


def check_concurrency(value: object, *, what: str = "global_concurrency") -> int:
    """Return value if it is a whole number of slots, else raise InvalidJob."""
    return limits.integer(what, value, 1, limits.MAX_INT, error=InvalidJob)


Partitioner = Callable[[Any], object]


def check_partition_by(value: object) -> str | Partitioner:
    """Return value if it is a payload key or a callable, else raise InvalidJob."""
    if callable(value) or (isinstance(value, str) and value):
        return value
    raise InvalidJob(
        f"partition_by must be a top-level payload key or a callable(payload) -> str, "
        f"not {limits.shown(value)}"
    )


def partition_of(name: str, partition_by: str | Partitioner, payload: Any) -> str:
    """Return the partition value of payload for handler `name`, else raise InvalidJob."""
    if callable(partition_by):
        try:
            value = partition_by(payload)
        except Exception as exc:  # the user's code: name it; BaseExceptions go through
            raise InvalidJob(
                f"{name}: partition_by raised {type(exc).__name__}: {safe_str(exc)}"
            ) from exc
        if not isinstance(value, str):
            raise InvalidJob(f"{name}: partition_by returned {type(value).__name__}, not a string")
    else:
        if not isinstance(payload, dict) or partition_by not in payload:
            raise InvalidJob(f"{name}: the payload has no key {partition_by!r} to partition by")
        value = payload[partition_by]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidJob(
                f"{name}: payload[{partition_by!r}] must be a string or an integer "
                f"to partition by, not {type(value).__name__}"
            )
        value = str(value)
    if len(value) > MAX_PARTITION_LENGTH:
        raise InvalidJob(
            f"{name}: the partition value is {len(value)} characters long; "
            f"the limit is {MAX_PARTITION_LENGTH}"
        )
    refused = _NOT_IN_PARTITION.search(value)
    if refused is not None:
        raise InvalidJob(
            f"{name}: the partition value {limits.shown(value)} holds "
            f"U+{ord(refused[0]):04X}; a partition value may hold any text but "
            f"{NOT_IN_PARTITION}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Limit:
    """One limited group: a handler's jobs (kind "name") or a queue's (kind "queue")."""

    kind: str
    value: str
    concurrency: int | None
    rate: Rate | None
    partitioned: bool = False

    @property
    def sliding(self) -> bool:
        """Whether the group's rate counts in a sliding window (flow.RATE_WINDOWS)."""
        return self.rate is not None and self.rate.sliding

    @property
    def key(self) -> str:
        """The group's key in locks (and its window counter before COUNTED_WINDOWS)."""
        return f"{self.kind}:{self.value}"

    def counter(self, seconds: int) -> str:
        """The key of the group's counter of starts in windows of `seconds`."""
        return f"{self.key}@{seconds}"

    def counters_read(self) -> list[str]:
        """The counters a claim of this group reads: its window length's and the plain key's."""
        return [self.key] if self.rate is None else [self.key, self.counter(self.rate.seconds)]

    def counters_written(self) -> tuple[list[str], list[int]]:
        """The counters a claim of this group adds its starts to, and their window lengths."""
        seconds = self.rate.seconds if self.rate is not None else 1
        return [self.key, *map(self.counter, COUNTED_WINDOWS)], [seconds, *COUNTED_WINDOWS]


def handler_limits(handlers: Iterable[Any]) -> list[Limit]:
    """Return the limited groups of handlers (registry.Handler), sorted by key."""
    return sorted(
        (
            Limit(
                "name",
                h.name,
                h.global_concurrency,
                h.rate_limit,
                h.partition_by is not None,
            )
            for h in handlers
            if h.global_concurrency is not None or h.rate_limit is not None
        ),
        key=lambda limit: limit.key,
    )


def configured(handlers: Iterable[Any], queues: object) -> list[Limit]:
    """Return every limited group: the handlers' (sorted), then QUEUES' (sorted)."""
    return handler_limits(handlers) + sorted(
        (Limit("queue", q, c, r) for q, (c, r) in queue_limits(queues).items()),
        key=lambda limit: limit.key,
    )


def window_start(now: datetime, rate: Rate) -> datetime:
    """Return the start of now's fixed window (as sql._WINDOW_START computes it)."""
    return datetime.fromtimestamp(now.timestamp() // rate.seconds * rate.seconds, tz=UTC)


def admits_again_in(rate: Rate, now: float) -> float:
    """Return the seconds after which a full window of rate may admit a start again.

    A fixed window: at its end (now: the epoch time). A sliding one: as its oldest
    starts age out, at an unknown time; N starts spread over a window are this far
    apart, so a worker that looks that often lags the window by one spacing at most.
    """
    if rate.sliding:
        return rate.seconds / rate.count
    return rate.seconds - now % rate.seconds


def queue_limits(setting: object) -> dict[str, tuple[int | None, Rate | None]]:
    """Return the limits of a QUEUES setting ({queue: {"global_concurrency", "rate_limit"}}).

    A list (or None) has none. Raise InvalidJob for a malformed dict.
    """
    if not isinstance(setting, Mapping):
        return {}
    found: dict[str, tuple[int | None, Rate | None]] = {}
    for queue, options in setting.items():
        if options is None:
            continue
        if not isinstance(options, Mapping):
            raise InvalidJob(f"QUEUES[{queue!r}] must be a dict of limits or None")
        unknown = set(options) - {"global_concurrency", "rate_limit", "rate_window"}
        if unknown:
            raise InvalidJob(
                f"QUEUES[{queue!r}] has unknown keys {sorted(unknown)}; "
                "known: global_concurrency, rate_limit, rate_window"
            )
        concurrency = options.get("global_concurrency")
        rate = options.get("rate_limit")
        limit = (
            None
            if concurrency is None
            else check_concurrency(concurrency, what=f"QUEUES[{queue!r}]['global_concurrency']")
        )
        window = options.get("rate_window")
        parsed = (
            None
            if rate is None and window is None
            else parse_rate(
                rate,
                what=f"QUEUES[{queue!r}]['rate_limit']",
                window=window,
                what_window=f"QUEUES[{queue!r}]['rate_window']",
            )
        )
        if limit is not None or parsed is not None:
            found[queue] = (limit, parsed)
    return found
