"""Priority aging (docs/worker.md#priority-aging): a waiting job is claimed as if its
priority rose one step per DJANGO_JOBS["PRIORITY_AGING"] seconds it has been due.

Its effective priority is ``priority + floor((now - run_at) / step)``; due jobs are
claimed highest effective priority first, then oldest run_at, then id. An ORDER BY
that expression would read and sort every due row of a queue at each claim, so the
claim walks the claim index instead: within one priority level the oldest due job
has the highest effective priority, so the best `limit` jobs overall are among the
first `limit` of each level in index order (run_at, id). The levels are found by a
skip scan of the same index (one probe per distinct priority of the queue's
waiting jobs). Cost: one probe per level and up to `limit` rows read per level,
instead of `limit` rows; nothing when aging is off (the claim is then the
statement of store/sql.py as it was).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.utils import timezone

from django_jobs import conf, limits
from django_jobs.models import JobQuerySet


def step() -> float | None:
    """Seconds per priority step of DJANGO_JOBS["PRIORITY_AGING"]; None: aging off."""
    value = conf.get("PRIORITY_AGING")
    return None if value is None else limits.priority_aging(value)


# PostgreSQL: the CTEs that replace CLAIM's `claimable` when aging is on (store/sql.py
# splices them in; `{skip}` is its filter of limited names). `levels`: per unpaused
# queue, its distinct priorities of unleased jobs, highest first, each found by one
# probe of django_jobs_job_claim (a recursive skip scan). `aged`: per level, its first
# %(limit)s due jobs in index order. `picked`: the best %(limit)s of them by effective
# priority, read back by primary key (= ANY of an array: a join let the planner hash the
# whole table) and locked with SKIP LOCKED (a row taken meanwhile is re-checked and
# passed over). `claimable`: expired leases first, as CLAIM takes them, then those, then
# (only when they fall short of the limit) the next due jobs in plain priority order,
# skipping locked rows in the index scan: `aged` reads unlocked, so a claim beside
# another one in flight picks the same first jobs, finds them all locked and would
# return none while other jobs are due (tests/test_priority_aging.py).
# `{expired}`: CLAIM's part that finds a queue's expired leases (store/sql.py's _EXPIRED);
# `{due}`: its due pick (store/sql.py's _DUE), with NOT_PICKED added to its filter.
CLAIMABLE = """levels(queue, priority) AS (
    SELECT a.name, (SELECT max(priority) FROM django_jobs_job
                    WHERE locked_by IS NULL AND queue = a.name)
    FROM active AS a
    UNION ALL
    SELECT l.queue, (SELECT max(priority) FROM django_jobs_job
                     WHERE locked_by IS NULL AND queue = l.queue AND priority < l.priority)
    FROM levels AS l
    WHERE l.priority IS NOT NULL
),
aged AS MATERIALIZED (
    SELECT d.id
    FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM django_jobs_job
        WHERE locked_by IS NULL
          AND queue = l.queue AND priority = l.priority
          AND run_at <= statement_timestamp()
          AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
          AND name <> ALL(%(exclude)s::text[])
          {skip}
        ORDER BY run_at, id
        LIMIT %(limit)s
    ) AS d
    WHERE l.priority IS NOT NULL
),
picked AS MATERIALIZED (
    SELECT j.id
    FROM django_jobs_job AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM aged)) AND j.locked_by IS NULL
    ORDER BY j.priority + floor(extract(epoch FROM statement_timestamp() - j.run_at)
                                / %(aging)s::float8) DESC,
             j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
claimable AS MATERIALIZED (
    SELECT c.id FROM (
        SELECT candidate.id
        FROM active AS q
        CROSS JOIN LATERAL (
            {expired}
        ) AS candidate
        UNION ALL
        SELECT id FROM picked
        UNION ALL
        SELECT next.id
        FROM active AS q
        CROSS JOIN LATERAL (
            {due}
        ) AS next
    ) AS c
    LIMIT %(limit)s
),"""
# The top-up's extra filter, spliced into store/sql.py's due pick (`{due}` above).
NOT_PICKED = "\n              AND id <> ALL(ARRAY(SELECT id FROM picked))"


def due_ids(due: JobQuerySet, wanted: int, seconds: float) -> list[uuid.UUID]:
    """The ORM claim's due jobs under aging (SQLite, MariaDB, CLAIM="orm"): the ids of
    up to `wanted` of `due`'s jobs with the highest effective priority, by the walk
    CLAIMABLE makes (each level found by one probe, then its first `wanted` due jobs in
    index order): two queries per priority level that has due jobs."""
    plain = due.order_by()
    plain.query.select_for_update = False  # reads only: lock_ids locks what is chosen
    now = timezone.now()
    found: list[tuple[float, datetime, uuid.UUID]] = []
    level = plain.order_by("-priority").values_list("priority", flat=True).first()
    while level is not None:  # a skip scan: one probe per level, highest first
        rows = plain.filter(priority=level).order_by("run_at", "id")
        for job_id, run_at in rows.values_list("id", "run_at")[:wanted]:
            effective = level + (now - run_at).total_seconds() // seconds
            found.append((-effective, run_at, job_id))
        lower = plain.filter(priority__lt=level).order_by("-priority")
        level = lower.values_list("priority", flat=True).first()
    found.sort()
    return [job_id for _effective, _run_at, job_id in found[:wanted]]
