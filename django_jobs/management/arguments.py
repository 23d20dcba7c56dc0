"""argparse types shared by the management commands: bad values fail with a clear message.

Each either returns a value within django_jobs.limits or raises ArgumentTypeError,
which argparse turns into a one-line error and exit code 2, before any SQL runs.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django_jobs import limits


def add_repeatable(
    parser: argparse.ArgumentParser,
    *flags: str,
    dest: str,
    type: Callable[[str], Any],
    metavar: str,
    help: str,
) -> None:
    """Add an option that may be given more than once: its values end up in a list at dest."""
    parser.add_argument(*flags, action="append", dest=dest, type=type, metavar=metavar, help=help)


def _number(text: str, kind: Callable[[str], float], what: str) -> float:
    try:
        return kind(text)
    except (ValueError, OverflowError):  # also ints of more than 4,300 digits
        raise argparse.ArgumentTypeError(f"{limits.shown(text)} is not {what}") from None


def _within[T](check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return check("the value", *args, **kwargs)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """A count from 1 to MAX_INT (batch sizes, --max-jobs, --limit)."""
    return _within(limits.integer, _number(text, int, "a whole number"), 1, limits.MAX_INT)


def threads(text: str) -> int:
    """A number of executor threads, 1 to MAX_CONCURRENCY."""
    return _within(limits.integer, _number(text, int, "a whole number"), 1, limits.MAX_CONCURRENCY)


def async_slots(text: str) -> int:
    """A number of async handlers run at once on the event loop, 1 to MAX_ASYNC_CONCURRENCY."""
    number = _number(text, int, "a whole number")
    return _within(limits.integer, number, 1, limits.MAX_ASYNC_CONCURRENCY)


def seconds(text: str) -> float:
    """A duration of more than 0 and at most ten years."""
    return _within(limits.seconds, _number(text, float, "a number of seconds"))


def seconds_or_zero(text: str) -> float:
    """A duration of 0 to ten years."""
    return _within(limits.seconds, _number(text, float, "a number of seconds"), zero=True)


def duration_or_none(text: str) -> timedelta | None:
    """A duration like 7d, 12h, 30m or 90s (up to ten years), or 'none' (no limit)."""
    try:
        return limits.duration(text, what="the age")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _name(check: Callable[[str], str], what: str) -> Callable[[str], str]:
    """An argparse type that checks a name with limits' `check`, saying what it is not."""

    def parse(text: str) -> str:
        try:
            return check(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{limits.shown(text)} is not a valid {what}"
            ) from None

    return parse


queue_name = _name(limits.queue_name, "queue name")
job_name = _name(limits.job_name, "job name")
workflow_name = _name(limits.workflow_name, "workflow name")


def tag(text: str) -> str:
    """A job's tag (enqueue(tags=...)): printable text of 1 to MAX_TAG_LENGTH characters."""
    try:
        return limits.tags([text])[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{limits.shown(text)} is not a job id (a UUID)") from None


def free_text(max_length: int) -> Callable[[str], str]:
    """Return the type of free text stored in a column of max_length characters."""

    def parse(value: str) -> str:
        if len(value) > max_length:
            raise argparse.ArgumentTypeError(
                f"is {len(value)} characters; the limit is {max_length}"
            )
        if not value.isprintable():
            # Also lone surrogates: bytes of argv that are not UTF-8.
            raise argparse.ArgumentTypeError(
                f"{limits.shown(value)} holds control or undecodable characters"
            )
        return value

    return parse
