"""Handlers with flow limits (issue 14), registered only by the tests that use them.

Worker subprocesses register them when started with JOBS_TEST_FLOW=1, so that every
other test keeps a registry without limits (SQLite and MariaDB run them unlimited, W302).
"""

import os
import time

from django_jobs import job
from django_jobs.registry import unregister
from tests.testapp.models import Audit


def _sleep(prefix, payload, ctx):
    label = f"{prefix}|{payload.get('customer', '')}|{payload['label']}"
    Audit.objects.create(label=f"start|{label}", job_id=ctx.id, attempt=ctx.attempt)
    time.sleep(payload["seconds"])
    Audit.objects.create(label=f"end|{label}", job_id=ctx.id, attempt=ctx.attempt)


def capped(payload, ctx):
    _sleep("capped", payload, ctx)


def partitioned(payload, ctx):
    _sleep("partitioned", payload, ctx)


def rated(payload, ctx):
    # The claim's time on the database clock: the windows are the database's.
    Audit.objects.create(label=f"rated|{ctx.started_at.timestamp()!r}", job_id=ctx.id)


def unlimited(payload, ctx):
    Audit.objects.create(label=f"unlimited|{payload['label']}", job_id=ctx.id)


NAMES = ("tests.flow.capped", "tests.flow.partitioned", "tests.flow.rated", "tests.flow.free")


def register():
    """Register the limited handlers; return them by short name."""
    return {
        "capped": job(name=NAMES[0], global_concurrency=2)(capped),
        "partitioned": job(name=NAMES[1], global_concurrency=1, partition_by="customer")(
            partitioned
        ),
        # A worker process may run another release's limit (tests/test_flow_windows.py),
        # or count it in a sliding window (tests/test_rate_sliding.py).
        "rated": job(
            name=NAMES[2],
            rate_limit=os.environ.get("JOBS_TEST_FLOW_RATE", "20/s"),
            rate_window=os.environ.get("JOBS_TEST_FLOW_WINDOW"),
        )(rated),
        "free": job(name=NAMES[3])(unlimited),
    }


def unregister_all():
    for name in NAMES:
        unregister(name)
