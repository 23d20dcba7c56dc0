"""Handlers that outlive their timeout (issue 22), registered only by the tests that use them.

Worker subprocesses register them when started with JOBS_TEST_STUCK=1 (and the
flow-limited one too with JOBS_TEST_STUCK=flow, PostgreSQL only), so that every
other test keeps its registry.
"""

import time

from django.db import connection

from django_jobs import Backoff, job
from django_jobs.registry import unregister
from tests.testapp.models import Audit

NAMES = ("tests.stuck.plain", "tests.stuck.capped", "tests.stuck.atomic", "tests.stuck.flow")


def stuck(payload, ctx):
    """Run `seconds` whatever ctx.cancelled says, querying the database as it goes."""
    label = f"{payload['label']}|{ctx.id}|{ctx.attempt}"
    Audit.objects.create(label=f"start|{label}", job_id=ctx.id, attempt=ctx.attempt)
    deadline = time.monotonic() + payload["seconds"]
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        time.sleep(0.05)
    Audit.objects.create(label=f"end|{label}", job_id=ctx.id, attempt=ctx.attempt)
    return "late"


def register(flow=False):
    """Register the handlers (the flow-limited one with `flow`); return them by short name."""
    now = Backoff.fixed(0, jitter=0)
    found = {
        "plain": job(name=NAMES[0], timeout=0.3, max_attempts=2, backoff=now)(stuck),
        "capped": job(name=NAMES[1], timeout=0.3, max_attempts=1, concurrency=1)(stuck),
        "atomic": job(name=NAMES[2], timeout=0.3, max_attempts=2, backoff=now, atomic=True)(stuck),
    }
    if flow:
        found["flow"] = job(name=NAMES[3], timeout=0.3, max_attempts=1, global_concurrency=1)(stuck)
    return found


def unregister_all():
    for name in NAMES:
        unregister(name)
