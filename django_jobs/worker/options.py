"""The worker's options: those left unset come from DJANGO_JOBS, each checked against its limit."""

from __future__ import annotations

from typing import Any, Protocol, cast

from django_jobs import limits, registry


class WorkerOptions(Protocol):
    """The options of a Worker, as resolve() fills them."""

    queues: list[str]
    concurrency: int
    async_concurrency: int
    batch: int
    max_jobs: int | None
    lease: float
    heartbeat: float
    grace: float
    poll_interval: float


def resolve(worker: WorkerOptions, settings: dict[str, Any]) -> None:
    """Fill unset options from settings; raise ValueError for any outside django_jobs.limits."""
    worker.concurrency = limits.integer(
        "concurrency", worker.concurrency or settings["CONCURRENCY"], 1, limits.MAX_CONCURRENCY
    )
    worker.async_concurrency = limits.integer(
        "async_concurrency",
        worker.async_concurrency or settings["ASYNC_CONCURRENCY"],
        1,
        limits.MAX_ASYNC_CONCURRENCY,
    )
    worker.batch = limits.integer("batch", worker.batch or settings["BATCH"], 1, limits.MAX_INT)
    if worker.max_jobs is not None:
        limits.integer("max_jobs", worker.max_jobs, 1, limits.MAX_INT)
    worker.lease = limits.seconds("lease", worker.lease or settings["LEASE"])
    if cast("float | None", worker.heartbeat) is None:
        worker.heartbeat = settings["HEARTBEAT"]
    if cast("float | None", worker.heartbeat) is None:
        worker.heartbeat = worker.lease / 3
    worker.heartbeat = limits.seconds("heartbeat", worker.heartbeat, zero=True)
    if worker.heartbeat >= worker.lease:
        raise ValueError(f"heartbeat ({worker.heartbeat:g}s) must be shorter than the lease")
    grace = worker.grace if cast("float | None", worker.grace) is not None else settings["GRACE"]
    worker.grace = limits.seconds("grace", grace, zero=True)
    poll = worker.poll_interval or settings["POLL_INTERVAL"]
    worker.poll_interval = limits.seconds("poll_interval", poll)
    for name in worker.queues or ():
        registry.check_queue(name, allowlist=False)
