"""Claim: leasing due jobs to a worker, expired leases first (docs/architecture.md).

One ClaimRequest says what the worker asks for. Without flow limits the engine's
claim is one statement (postgres: sql.CLAIM; the ORM's conditional UPDATEs in
portable.Portable.claim_rows, MariaDB's locking read in mysql.MySQL.lock_due);
with them, postgres.Postgres.claim_flow.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_jobs.models import JobQuerySet
from django_jobs.rows import ClaimedJob, ClaimRequest, Finished, Settled
from django_jobs.store import settle
from django_jobs.store.engine import engine


def claim(jobs: JobQuerySet, request: ClaimRequest) -> list[ClaimedJob]:
    """Lease up to `request.limit` jobs of `request.queues`, counting an attempt each.

    Jobs whose lease expired (their worker died, hung or lost its connection)
    are taken over first, so no task is needed to rescue them; then due jobs
    in priority order. Paused queues are left out (see ClaimRequest for the rest).
    """
    if not request.queues:
        return []
    if request.flow_limits:
        return engine(jobs.db).claim_flow(jobs, request)[1]
    return engine(jobs.db).claim(jobs, request)


def complete_and_claim(
    jobs: JobQuerySet, finished: Sequence[Finished], request: ClaimRequest
) -> tuple[Settled, list[ClaimedJob]]:
    """Settle `finished` as settle.complete does, then claim as claim does.

    With flow limits (PostgreSQL), the settle runs in the limited claim's
    transaction, before its locks: one commit, and for one group one round
    trip, in which the slots the settle frees are claimed again. An error
    rolls both back. Returns complete()'s positions and claim()'s jobs.
    """
    if not request.flow_limits or not request.queues:
        settled = settle.complete(jobs, finished)
        return settled, claim(jobs, request)  # no limits, or no queues: nothing claimed
    return engine(jobs.db).claim_flow(jobs, request, finished)
