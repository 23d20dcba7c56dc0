"""Hostile handlers, driven by their payload: what they raise, return or print.

The payload is JSON, which cannot carry a lone surrogate: texts are described
({"text": "ab", "repeat": 3, "nul": true, "surrogate": true}) and built here.
"""

from __future__ import annotations

import asyncio
import math
import sys

from django_jobs import FatalError, job
from tests.testapp.models import Audit


class HostileBase(BaseException):
    """A BaseException of the user's own (as some libraries define for control flow)."""


class BadStr(Exception):
    """An exception whose str() raises."""

    def __str__(self):
        raise RuntimeError("str() of this exception raises")

    def __repr__(self):
        raise RuntimeError("repr() of this exception raises")


class BadNotes(Exception):
    """An exception whose traceback cannot be formatted (its __notes__ raise a BaseException)."""

    @property
    def __notes__(self):
        raise KeyboardInterrupt("reading __notes__")


RAISES = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
    "HostileBase": HostileBase,
    "ValueError": ValueError,
    "BadStr": BadStr,
    "BadNotes": BadNotes,
    "FatalError": FatalError,
}

# The type each raised class is recorded as.
RECORDED = {name: f"{cls.__module__}.{cls.__qualname__}" for name, cls in RAISES.items()}


def text(spec) -> str:
    """Build the text a payload describes."""
    if isinstance(spec, str):
        return spec.replace("<SUR>", "\ud800")
    value = spec.get("text", "").replace("<SUR>", "\ud800") * spec.get("repeat", 1)
    if spec.get("nul"):
        value = f"{value[:3]}\x00{value[3:]}"
    if spec.get("surrogate"):
        value = f"{value[:5]}\ud800{value[5:]}"
    return value


def value(spec):
    """Build the return value a payload describes (unstorable ones included)."""
    kind = spec.get("kind")
    if kind == "text":
        return text(spec)
    if kind == "dict":
        return {text(spec.get("key", "k")): text(spec.get("value", "v"))}
    if kind == "nan":
        return {"x": math.nan}
    if kind == "inf":
        return [math.inf]
    if kind == "set":
        return {"s": {1, 2}}
    if kind == "deep":
        nested = []
        for _ in range(100_000):
            nested = [nested]
        return nested
    return spec.get("json")


def _behave(payload, ctx):
    Audit.objects.create(label=payload.get("label", "hostile"), job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("print"):
        sys.stdout.write("x" * payload["print"] + "\n")
        sys.stderr.write("y" * payload["print"] + "\n")
    if "raise" in payload:
        raise RAISES[payload["raise"]](text(payload.get("message", "")))
    return value(payload.get("return", {}))


@job(name="tests.hostile", max_attempts=2, backoff=0)
def hostile(payload, ctx):
    return _behave(payload, ctx)


@job(name="tests.hostile_atomic", atomic=True, max_attempts=2, backoff=0)
def hostile_atomic(payload, ctx):
    return _behave(payload, ctx)


@job(name="tests.hostile_async", max_attempts=2, backoff=0)
async def hostile_async(payload, ctx):
    from asgiref.sync import sync_to_async

    if payload.get("cancelled"):
        # What an async handler meets when a task it awaits is cancelled.
        await sync_to_async(Audit.objects.create)(label="cancelled", job_id=ctx.id)
        task = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        await task
    return await sync_to_async(_behave)(payload, ctx)


def _validate_hostile(payload):
    if payload.get("validator") == "raise":
        raise RAISES[payload["raise"]]("raised by the validator")
    if payload.get("validator") == "invalid":
        raise ValueError("the validator refuses this payload")
    return payload


@job(name="tests.hostile_validated", max_attempts=2, backoff=0, validate=_validate_hostile)
def hostile_validated(payload, ctx):
    Audit.objects.create(label="validated-ran", job_id=ctx.id, attempt=ctx.attempt)


@job(name="tests.hostile_retry_later", max_attempts=3, backoff=3600)
def hostile_retry_later(payload, ctx):
    """Raise a BaseException; the retry is an hour away (the row stays to be looked at)."""
    Audit.objects.create(label="retry-later", job_id=ctx.id, attempt=ctx.attempt)
    raise RAISES[payload.get("raise", "KeyboardInterrupt")]("from the handler")
