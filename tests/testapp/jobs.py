"""Handlers the tests enqueue; worker subprocesses discover them like any app's jobs.py."""

import os
import time

from django_jobs import FatalError, job
from tests.testapp.models import Audit


@job(name="tests.record")
def record(payload, ctx):
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    return {"label": payload["label"]}


@job(name="tests.record_atomic", atomic=True)
def record_atomic(payload, ctx):
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])


@job(name="tests.noop")
def noop(payload, ctx):
    return None


@job(name="tests.flaky", max_attempts=3)
def flaky(payload, ctx):
    """Fail until attempt `succeed_on`."""
    Audit.objects.create(label="flaky", job_id=ctx.id, attempt=ctx.attempt)
    if ctx.attempt < payload.get("succeed_on", 99):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return ctx.attempt


@job(name="tests.fatal")
def fatal(payload, ctx):
    raise FatalError("this cannot succeed")


@job(name="tests.crash", max_attempts=2)
def crash(payload, ctx):
    """Kill the whole worker process, every time."""
    os._exit(13)


@job(name="tests.sleep")
def sleep(payload, ctx):
    Audit.objects.create(label=f"start-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt)
    deadline = time.monotonic() + payload["seconds"]
    while time.monotonic() < deadline:
        if payload.get("cooperative") and ctx.is_cancelled:
            raise TimeoutError("cancelled")
        time.sleep(0.01)
    Audit.objects.create(label=f"end-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt)


def _positive(payload):
    if not isinstance(payload, dict) or not isinstance(payload.get("n"), int) or payload["n"] < 0:
        raise ValueError("payload needs a non-negative integer n")
    return payload


@job(name="tests.validated", validate=_positive)
def validated(payload, ctx):
    Audit.objects.create(label=f"n={payload['n']}", job_id=ctx.id)


@job(name="tests.timeout", timeout=0.5, max_attempts=2)
def slow(payload, ctx):
    Audit.objects.create(label="slow-start", job_id=ctx.id, attempt=ctx.attempt)
    ctx.cancelled.wait(5)
    Audit.objects.create(label="slow-late-end", job_id=ctx.id, attempt=ctx.attempt)


@job(name="tests.other_queue", queue="emails")
def other_queue(payload, ctx):
    Audit.objects.create(label="emails", job_id=ctx.id)


@job(name="tests.async_record")
async def async_record(payload, ctx):
    from asgiref.sync import sync_to_async

    await sync_to_async(Audit.objects.create)(label=payload["label"], job_id=ctx.id)
    return "async-ok"
