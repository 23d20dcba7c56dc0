"""Handlers of tests/test_workflow_blackbox.py: an outside tester's workflow steps.

A step records "bb|<label>|<missing>" in an Audit row, where <missing> counts the
parents it was told of (payload "parents": their idempotency keys) that had no
completion marker yet when it started; it returns what ctx.parent_results held.
"""

import time

from django_jobs import FatalError, job
from django_jobs.models import CompletionMarker
from tests.testapp.models import Audit


@job(name="tests.bb.step", max_attempts=30, backoff=0.2)
def step(payload, ctx):
    parents = payload.get("parents", [])
    found = CompletionMarker.objects.filter(key__in=parents).count() if parents else 0
    Audit.objects.create(
        label=f"bb|{payload['label']}|{len(parents) - found}", job_id=ctx.id, attempt=ctx.attempt
    )
    time.sleep(payload.get("ms", 0) / 1000)
    return {"label": payload["label"], "saw": dict(ctx.parent_results)}


@job(name="tests.bb.chunk", atomic=True, max_attempts=50, backoff=0.2)
def chunk(payload, ctx):
    Audit.objects.create(label=f"bbchunk|{payload['i']}", job_id=ctx.id, attempt=ctx.attempt)
    return payload["i"]


@job(name="tests.bb.total", atomic=True, max_attempts=50, backoff=0.2)
def total(payload, ctx):
    results = ctx.parent_results
    Audit.objects.create(label=f"bbtotal|{len(results)}", job_id=ctx.id, attempt=ctx.attempt)
    return sum(results.values())


@job(name="tests.bb.fragile")
def fragile(payload, ctx):
    """Fail for good until the test writes an Audit row "bbheal|<label>"."""
    if not Audit.objects.filter(label=f"bbheal|{payload['label']}").exists():
        raise FatalError(f"{payload['label']} cannot succeed yet")
    Audit.objects.create(label=f"bb|{payload['label']}|0", job_id=ctx.id, attempt=ctx.attempt)
    return {"label": payload["label"], "healed": True}


@job(name="tests.bb.stubborn", max_attempts=1)
def stubborn(payload, ctx):
    """Run until cancelled (or 30 s), then stop by raising."""
    Audit.objects.create(label="bbrunning", job_id=ctx.id, attempt=ctx.attempt)
    if ctx.cancelled.wait(30):
        raise RuntimeError("stopped on request")
    return "not cancelled"
