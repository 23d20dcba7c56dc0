"""The worker's options: those left unset come from DJANGO_JOBS, each checked against its limit."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_jobs import conf, flow, limits, registry
from django_jobs.store import JobStore

logger = logging.getLogger("django_jobs.worker")

# The unenforced flow limits already logged by this process (database, group keys).
_UNENFORCED_TOLD: set[tuple[str, tuple[str, ...]]] = set()


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


def flow_limits(store: JobStore) -> list[flow.Limit]:
    """Return the flow limits of the handlers and of QUEUES (docs/flow-control.md).

    None where the database does not enforce them (W302; logged once per process).
    """
    try:
        found = flow.configured(registry.all_handlers().values(), conf.get("QUEUES"))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DJANGO_JOBS['QUEUES']: {exc}") from None
    if found and not store.enforces_limits:
        database = connections[store.alias].display_name
        told = (database, tuple(g.key for g in found))
        if told not in _UNENFORCED_TOLD:  # once per process: drain() builds a worker a call
            _UNENFORCED_TOLD.add(told)
            logger.warning(
                "flow limits (%s) are enforced on PostgreSQL only, and the jobs database "
                "is %s: this worker runs their jobs without limits (django_jobs.W302)",
                ", ".join(g.key for g in found),
                database,
            )
        return []
    return found


def look_again_in(looks: int, poll_interval: float, limits: list[flow.Limit]) -> float:
    """The pause before looking again for due work that `looks` empty claims in a row missed.

    None after the first (a race lost to another claim); then longer each time, up to
    a poll interval (rows another worker is claiming or running, full slots of a
    limit), and no longer than until a full rate window admits again: at the next
    window's start, or as a sliding one's oldest starts age out (on the database clock).
    """
    if not looks:
        return 0.0
    pause = min(poll_interval, 0.005 * 2.0 ** min(looks - 1, 20))
    rates = [g.rate for g in limits if g.rate is not None]
    if rates:
        now = time.time()
        pause = min(pause, min(flow.admits_again_in(r, now) for r in rates) + 0.002)
    return pause
