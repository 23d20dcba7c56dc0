"""No-op handlers, as in the peers' published benchmarks."""

import time

from django_jobs import job


@job(name="bench.noop")
def noop(payload, ctx):
    return None


@job(name="bench.started")
def started(payload, ctx):
    """Record when the handler started (time.time(): the same clock as the enqueuer's)."""
    return time.time()
