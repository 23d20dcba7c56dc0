"""Chunk handlers run by real worker processes (tests/test_chunk_processes.py).

Worker subprocesses register them when started with JOBS_TEST_CHUNKS=1, so that
every other test keeps its registry.
"""

import time

from django_jobs import job
from django_jobs.registry import unregister
from tests.testapp.models import Audit

NAMES = ("tests.chunkproc.atomic", "tests.chunkproc.plain")


def _record(payloads, ctx):
    """Write one Audit row per payload (label "n-<n>"), then take `sleep` seconds per chunk.

    Effects first: a kill during the sleep finds them written and the jobs not settled
    (an atomic chunk's rolled back, a plain one's kept: its retry writes them again).
    """
    Audit.objects.bulk_create(
        Audit(label=f"n-{p['n']}", job_id=c.id, attempt=c.attempt)
        for p, c in zip(payloads, ctx.jobs, strict=True)
    )
    time.sleep(max((p.get("sleep", 0) for p in payloads), default=0))
    return [p["n"] for p in payloads]


def register():
    """Register the handlers; return them by short name."""
    return {
        "atomic": job(name=NAMES[0], chunk=10, chunk_wait=0.2, atomic=True)(_record),
        "plain": job(name=NAMES[1], chunk=10, chunk_wait=0.2)(_record),
    }


def unregister_all():
    for name in NAMES:
        unregister(name)
