"""Async handlers of the event loop tests (issue 25), registered only by the tests that use them.

Worker subprocesses register them when started with JOBS_TEST_ASYNC=1, so that
every other test keeps its registry.
"""

import asyncio
import time

from asgiref.sync import sync_to_async

from django_jobs import Backoff, job
from django_jobs.registry import unregister
from tests.testapp.models import Audit

NAMES = (
    "tests.async.nap",
    "tests.async.capped",
    "tests.async.timed",
    "tests.async.swallow",
    "tests.async.blocker",
    "tests.async.orm",
    "tests.async.odd",
    "tests.async.child",
)

# The handlers running now on this process's loop (one thread: no lock needed).
_running = {"now": 0}


async def nap(payload, ctx):
    """Await `seconds`; return how many handlers of this process were running meanwhile."""
    _running["now"] += 1
    peak = _running["now"]
    try:
        deadline = time.monotonic() + payload["seconds"]
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.01))
            peak = max(peak, _running["now"])
    finally:
        _running["now"] -= 1
    return peak


async def timed(payload, ctx):
    """Await far longer than the timeout; say in an Audit row when the task is cancelled."""
    try:
        await asyncio.sleep(payload.get("seconds", 600))
    except asyncio.CancelledError:
        await sync_to_async(Audit.objects.create)(label="cancelled", job_id=ctx.id)
        raise
    return "slept"


async def swallow(payload, ctx):
    """Swallow the cancellation, then go on awaiting for `after` seconds."""
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await sync_to_async(Audit.objects.create)(label="swallowed", job_id=ctx.id)
    deadline = time.monotonic() + payload["after"]
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
    return "late"


async def blocker(payload, ctx):
    """Block the loop with time.sleep (never awaiting) for `seconds`."""
    time.sleep(payload["seconds"])  # noqa: ASYNC251 - the hostile handler under test
    return "blocked"


async def orm(payload, ctx):
    """Write an Audit row through sync_to_async, awaiting a little around it."""
    await asyncio.sleep(0.05)
    await sync_to_async(Audit.objects.create)(label=payload["label"], job_id=ctx.id)
    await asyncio.sleep(0.05)
    return "written"


async def odd(payload, ctx):
    """Return what a completion marker cannot hold."""
    return object()


async def child(payload, ctx):
    """Return the parents' results, read with the async form."""
    return await ctx.aparent_results()


def _validate_with_the_orm(payload):
    """A validator that reads the database (sync code, called for an async handler)."""
    Audit.objects.create(label="validated", job_id=None)
    return payload


def register():
    """Register the handlers; return them by short name."""
    now = Backoff.fixed(0, jitter=0)
    return {
        "nap": job(name=NAMES[0], max_attempts=1)(nap),
        "capped": job(name=NAMES[1], max_attempts=1, concurrency=3)(nap),
        "timed": job(name=NAMES[2], timeout=0.3, max_attempts=2, backoff=now)(timed),
        "swallow": job(name=NAMES[3], timeout=0.3, max_attempts=1)(swallow),
        "blocker": job(name=NAMES[4], max_attempts=1)(blocker),
        "orm": job(name=NAMES[5], max_attempts=1)(orm),
        "odd": job(name=NAMES[6], max_attempts=1)(odd),
        "child": job(name=NAMES[7], max_attempts=1)(child),
        "short": job(name="tests.async.short", timeout=0.5, max_attempts=1)(nap),
        "validated": job(name="tests.async.validated", validate=_validate_with_the_orm)(orm),
        "stuck_blocker": job(name="tests.async.stuck_blocker", timeout=0.3, max_attempts=2)(
            blocker
        ),
    }


def unregister_all():
    for name in (*NAMES, "tests.async.short", "tests.async.stuck_blocker", "tests.async.validated"):
        unregister(name)
