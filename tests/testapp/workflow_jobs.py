"""Workflow steps (issue 15) for tests/test_workflow_*.py, in-process and in worker processes.

Every step records its start in an Audit row "start|<label>|<missing>", where
<missing> counts the parents (payload "parents": their idempotency keys) that had
no completion marker yet when it started, and whose created_at is then set on the
database clock (the clock of the markers' completed_at). A step returns what it
saw in ctx.parent_results.
"""

import time

from django.db.models.functions import Now

from django_jobs import FatalError, job
from django_jobs.models import CompletionMarker
from tests.testapp.models import Audit


def record_start(payload, ctx):
    """Record this run's start on the database clock, and the parents without a marker yet."""
    parents = payload.get("parents", [])
    found = CompletionMarker.objects.filter(key__in=parents).count() if parents else 0
    row = Audit.objects.create(
        label=f"start|{payload['label']}|{len(parents) - found}", job_id=ctx.id, attempt=ctx.attempt
    )
    # auto_now_add takes the worker's clock: the markers' completed_at is the database's.
    Audit.objects.filter(pk=row.pk).update(created_at=Now())


def _step(payload, ctx):
    record_start(payload, ctx)
    seen = dict(ctx.parent_results)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    fail = payload.get("fail")
    if fail == "flaky":  # its first attempt fails, its retry succeeds
        if ctx.attempt == 1:
            raise RuntimeError(f"{payload['label']} failed its first attempt")
    # A failing step fails until the test "heals" it (then its replay succeeds).
    elif fail and not Audit.objects.filter(label=f"heal|{payload['label']}").exists():
        if fail == "fatal":
            raise FatalError(f"{payload['label']} cannot succeed")
        raise RuntimeError(f"{payload['label']} failed")
    if payload.get("full"):
        saw = seen
    else:  # just the parents' labels: whole results would nest without bound down a DAG
        saw = {key: (value or {}).get("label") for key, value in seen.items()}
    return {"label": payload["label"], "saw": saw}


step = job(name="tests.wf.step")(_step)
step_atomic = job(name="tests.wf.step_atomic", atomic=True)(_step)


def _chunk(payload, ctx):
    Audit.objects.create(label=f"chunk|{payload['i']}", job_id=ctx.id, attempt=ctx.attempt)
    if payload.get("ms"):
        time.sleep(payload["ms"] / 1000)
    return payload["i"]


# One chunk of a fan-out that takes a while: an atomic effect (one Audit row per success),
# or a plain one (settled in the worker's batches; a killed attempt's effect stays).
chunk = job(name="tests.wf.chunk", atomic=True, max_attempts=30, backoff=0.5)(_chunk)
chunk_plain = job(name="tests.wf.chunk_plain", max_attempts=30, backoff=0.5)(_chunk)


@job(name="tests.wf.fan_in", atomic=True, max_attempts=30, backoff=0.5)
def fan_in(payload, ctx):
    """The fan-in after every chunk: an atomic start record, and the sum of the chunks' results."""
    record_start(payload, ctx)
    results = ctx.parent_results
    return {"parents": len(results), "sum": sum(results.values())}
