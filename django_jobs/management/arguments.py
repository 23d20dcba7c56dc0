"""argparse types shared by the management commands: bad values fail with a clear message."""

from __future__ import annotations

import argparse
import uuid

from django_jobs.registry import MAX_NAME_LENGTH, MAX_QUEUE_LENGTH, NAME_RE, QUEUE_RE


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def seconds_or_zero(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else seconds(text)


def queue_name(text: str) -> str:
    if not QUEUE_RE.fullmatch(text) or len(text) > MAX_QUEUE_LENGTH:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid queue name")
    return text


def job_name(text: str) -> str:
    if not NAME_RE.fullmatch(text) or len(text) > MAX_NAME_LENGTH:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid job name")
    return text


def job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a UUID)") from None
