"""No-op handlers, as in the peers' published benchmarks."""

import os
import time

from django_jobs import job

# CAP: the cap and the duration of bench.capped (theoretical rate: CAP / CAPPED_SECONDS).
CAP, CAPPED_SECONDS = 4, 0.05


@job(name="bench.noop")
def noop(payload, ctx):
    return None


@job(name="bench.started")
def started(payload, ctx):
    """Record when the handler started, and when its claim began (the database's now()).

    Both on the machine's clock, as the enqueuer's time.time(): L1 splits the wait
    into wake-up (commit to claim) and claim plus hand-off (claim to handler).
    """
    return [time.time(), ctx.started_at.timestamp() if ctx.started_at else None]


@job(name="bench.sleep")
def sleep(payload, ctx):
    """CAP0: the jobs of bench.capped without a limit, on as many threads as its cap."""
    time.sleep(CAPPED_SECONDS)


# Flow control (issue 14), registered in worker processes started with BENCH_FLOW=1:
# D1F drains bench.noop with these limits configured on other handlers of its queue,
# CAP measures a handler held to global_concurrency=4.
if os.environ.get("BENCH_FLOW") == "1":

    @job(name="bench.limited", global_concurrency=5)
    def limited(payload, ctx):
        return None

    @job(name="bench.rated", rate_limit="100/s", global_concurrency=10, partition_by="c")
    def rated(payload, ctx):
        return None

    @job(name="bench.capped", global_concurrency=CAP)
    def capped(payload, ctx):
        time.sleep(CAPPED_SECONDS)


# IO (issue 25), registered in worker processes started with BENCH_IO=1: jobs that
# wait on I/O, written the modern way (await) and the threaded way (time.sleep).
if os.environ.get("BENCH_IO") == "1":
    import asyncio

    @job(name="bench.await")
    async def awaits(payload, ctx):
        await asyncio.sleep(payload["s"])

    @job(name="bench.block")
    def blocks(payload, ctx):
        time.sleep(payload["s"])
