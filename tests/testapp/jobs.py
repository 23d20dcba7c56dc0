"""Handlers the tests enqueue; worker subprocesses discover them like any app's jobs.py."""

import asyncio
import os
import time

from django.conf import settings

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


@job(name="tests.flood", atomic=True)
def flood(payload, ctx):
    """A priority-10 job that, until `until` (epoch seconds), enqueues its successor in its
    own transaction: the queue holds the same number of them all along (tests of aging)."""
    from django_jobs import enqueue

    Audit.objects.create(label="high", job_id=ctx.id, attempt=ctx.attempt)
    time.sleep(payload["sleep"])
    if time.time() < payload["until"]:
        enqueue(flood, payload, priority=10)


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


@job(name="tests.big_result", max_attempts=1)
def big_result(payload, ctx):
    """Return a string of payload["chars"] characters."""
    return "x" * payload["chars"]


@job(name="tests.fatal_runs")
def fatal_runs(payload, ctx):
    """Die (FatalError) on the first `fails` runs of `label`, replays included; then succeed."""
    runs = Audit.objects.filter(label=payload["label"]).count()
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if runs < payload["fails"]:
        raise FatalError(f"run {runs + 1} of {payload['label']} dies")


@job(name="tests.crash", max_attempts=2)
def crash(payload, ctx):
    """Kill the whole worker process, every time."""
    os._exit(13)


@job(name="tests.sleep")
def sleep(payload, ctx):
    Audit.objects.create(
        label=f"start-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt
    )
    deadline = time.monotonic() + payload["seconds"]
    while time.monotonic() < deadline:
        if payload.get("cooperative") and ctx.is_cancelled:
            raise TimeoutError("cancelled")
        time.sleep(0.01)
    Audit.objects.create(
        label=f"end-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt
    )


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


# In-process observations (a worker thread writes, the test reads).
running_now = {"count": 0, "max": 0}


@job(name="tests.capped", concurrency=1)
def capped(payload, ctx):
    import threading

    lock = running_now.setdefault("lock", threading.Lock())
    with lock:
        running_now["count"] += 1
        running_now["max"] = max(running_now["max"], running_now["count"])
    time.sleep(0.05)
    with lock:
        running_now["count"] -= 1


@job(name="tests.leaky")
def leaky(payload, ctx):
    """Leave a transaction open and uncommitted: the worker must roll it back."""
    from django.db import connection

    connection.set_autocommit(False)
    Audit.objects.create(label="uncommitted", job_id=ctx.id)


@job(name="tests.connection_info")
def connection_info(payload, ctx):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    backend = (
        connection.connection.info.backend_pid
        if connection.vendor == "postgresql"
        else id(connection.connection)
    )
    Audit.objects.create(label=f"pid={backend} queries={len(connection.queries)}", job_id=ctx.id)


@job(name="tests.bad_return")
def bad_return(payload, ctx):
    return {"not json": {1, 2}}


@job(name="tests.chaos_atomic", atomic=True, max_attempts=30, backoff=0.5)
def chaos_atomic(payload, ctx):
    """An atomic effect that takes a while: the kill storm's and the settle-failure test's job."""
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("ms"):
        time.sleep(payload["ms"] / 1000)


@job(name="tests.slow_first")
def slow_first(payload, ctx):
    """Sleep past the lease on the first attempt only (without extending it)."""
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("slow") and ctx.attempt == 1:
        time.sleep(payload["slow"])


@job(name="tests.record_where", atomic=True, max_attempts=30, backoff=0.5)
def record_where(payload, ctx):
    """An atomic effect written on the job's own database (jobs in several databases)."""
    Audit.objects.using(ctx.database).create(
        label=payload["label"], job_id=ctx.id, attempt=ctx.attempt
    )
    if payload.get("ms"):
        time.sleep(payload["ms"] / 1000)


@job(name="tests.slow_first_atomic", atomic=True, max_attempts=10)
def slow_first_atomic(payload, ctx):
    Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("slow") and ctx.attempt == 1:
        time.sleep(payload["slow"])


@job(name="tests.query")
def query(payload, ctx):
    """One query per job: with DEBUG=True each would land in connection.queries."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s", [payload.get("n", 0)])


# ---- operations (schedules, snooze, cancel) ----


@job(name="tests.record_key")
def record_key(payload, ctx):
    """Record the job's key: periodic jobs carry their schedule and tick in it."""
    Audit.objects.create(label=ctx.key, job_id=ctx.id, attempt=ctx.attempt)


@job(name="tests.snoozer", max_attempts=1)
def snoozer(payload, ctx):
    """Snooze `times` times (counted in Audit rows), then succeed."""
    runs = Audit.objects.filter(job_id=ctx.id).count()
    Audit.objects.create(label=f"snoozer-{runs}", job_id=ctx.id, attempt=ctx.attempt)
    if runs < payload["times"]:
        ctx.snooze(payload.get("seconds", 0))
    return runs


@job(name="tests.snoozer_atomic", atomic=True, max_attempts=1)
def snoozer_atomic(payload, ctx):
    """An atomic handler whose write is rolled back when it snoozes."""
    from django_jobs import Snooze

    Audit.objects.create(label="atomic-effect", job_id=ctx.id, attempt=ctx.attempt)
    if not Audit.objects.filter(label="snooze-done").exists():
        raise Snooze(0)


@job(name="tests.until_cancelled", max_attempts=5)
def until_cancelled(payload, ctx):
    """Run until ctx.cancelled is set (or `seconds` pass), then stop by raising."""
    Audit.objects.create(
        label=f"start-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt
    )
    if ctx.cancelled.wait(payload.get("seconds", 30)):
        raise RuntimeError("stopped: cancelled")
    Audit.objects.create(
        label=f"end-{payload.get('label', '')}", job_id=ctx.id, attempt=ctx.attempt
    )


# A handler of the "new release" only: worker processes started with
# JOBS_TEST_OLD_RELEASE=1 (tests/settings.py) run the code from before it existed.
if not settings.JOBS_TEST_OLD_RELEASE:

    @job(name="tests.added_in_v2")
    def added_in_v2(payload, ctx):
        Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)


# Hostile handlers (issue 10): what they raise, return or print comes from the payload;
# workflow steps (issue 15) record when they started and what they saw.
from tests.testapp import blackbox_jobs, hostile, workflow_jobs  # noqa: E402, F401

# Flow control (issue 14): limited handlers only in the worker processes that ask.
if os.environ.get("JOBS_TEST_FLOW") == "1":
    from tests.testapp import flow_jobs

    flow_jobs.register()

# Handlers that outlive their timeout (issue 22): only in the worker processes that ask.
if os.environ.get("JOBS_TEST_STUCK"):
    from tests.testapp import stuck_jobs

    stuck_jobs.register(flow=os.environ["JOBS_TEST_STUCK"] == "flow")


@job(name="tests.traced", max_attempts=3)
def traced(payload, ctx):
    """Work in a span of its own, failing until attempt `succeed_on` (tests/test_tracing.py)."""
    from opentelemetry import trace  # here: the other tests run without OpenTelemetry

    with trace.get_tracer("tests").start_as_current_span("handler work"):
        Audit.objects.create(label=payload["label"], job_id=ctx.id, attempt=ctx.attempt)
    if ctx.attempt < payload.get("succeed_on", 1):
        raise RuntimeError(f"traced failure on attempt {ctx.attempt}")
    if payload.get("fatal"):
        raise FatalError("traced: fatal")
    return ctx.attempt


def _wait_for_file(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@job(name="tests.progressing", max_attempts=1)
def progressing(payload, ctx):
    """Report progress in a tight loop, wait for payload["go"] (a file), then end as told."""
    total = payload["total"]
    for done in range(total + 1):
        ctx.progress(done, total, note=f"row {done}")
    Audit.objects.create(label="progressing", job_id=ctx.id, attempt=ctx.attempt)
    _wait_for_file(payload.get("go"))
    ctx.progress(total, total, note="finished")
    if payload.get("fatal"):
        raise FatalError("progressing: fatal")
    return total


@job(name="tests.async_progressing")
async def async_progressing(payload, ctx):
    for done in range(payload["total"] + 1):
        ctx.progress(done, payload["total"], note="async")
    return "ok"


@job(name="tests.traced_async", max_attempts=2)
async def traced_async(payload, ctx):
    """traced on the worker's event loop: a span of its own across awaits (test_tracing)."""
    from opentelemetry import trace  # here: the other tests run without OpenTelemetry

    await asyncio.sleep(0.01)
    with trace.get_tracer("tests").start_as_current_span("async handler work"):
        await asyncio.sleep(0.01)
    if ctx.attempt < payload.get("succeed_on", 1):
        raise RuntimeError(f"async traced failure on attempt {ctx.attempt}")
    return ctx.attempt


@job(name="tests.tagged", tags=["billing"])
def tagged(payload, ctx):
    """A handler whose jobs carry a tag of its own (tests/test_tags.py)."""
    if payload and payload.get("fatal"):
        raise FatalError("tagged: fatal")


# Async handlers on the worker's event loop (issue 25): only in the worker processes that ask.
if os.environ.get("JOBS_TEST_ASYNC"):
    from tests.testapp import async_jobs

    async_jobs.register()

# Chunk handlers shared by worker processes: only in the worker processes that ask.
if os.environ.get("JOBS_TEST_CHUNKS"):
    from tests.testapp import chunk_jobs

    chunk_jobs.register()
