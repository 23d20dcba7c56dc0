"""PostgreSQL statements of the hot path, each one round trip and one transaction.

Kept here, named and commented, so that the SQL the worker runs thousands of
times a second can be read in one place. The PostgreSQL engine
(``store/postgres.py``) runs them through ``run``; the other engines use the ORM. Times come
from the database clock, never the worker's: ``statement_timestamp()``, as in
enqueue and Django's ``Now()``. In the worker's single-statement transactions it
equals ``now()``; inside a longer transaction (a ``TestCase``'s, under
``django_jobs.testing.drain``) ``now()`` would stay at that transaction's start,
before every job enqueued in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from django.db import connections

from django_jobs import flow
from django_jobs.attempts import LEASE_EXPIRED, LEASE_EXPIRED_MESSAGE
from django_jobs.store import aging
from django_jobs.store.pgrun import run

# split_part(locked_by, '#', 1) below is the SQL twin of attempts.worker_of: the
# worker id of a lease token (tests/test_claim.py compares the two).
assert "'" not in LEASE_EXPIRED + LEASE_EXPIRED_MESSAGE  # noqa: S101 - spliced into CLAIM

if TYPE_CHECKING:
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper


# What a claim sets on each row it leases, and what it returns (CLAIM and CLAIM_LIMITED).
_LEASE = f"""
    SET attempts = j.attempts + 1,
        locked_by = %(token)s,
        lease_expires_at = statement_timestamp() + %(lease)s * interval '1 second',
        attempted_at = statement_timestamp(),
        started_at = COALESCE(j.started_at, statement_timestamp()),
        errors = CASE WHEN j.locked_by IS NULL THEN j.errors ELSE j.errors || jsonb_build_array(
            jsonb_build_object(
                'attempt', j.attempts,
                'at', statement_timestamp(),
                'type', '{LEASE_EXPIRED}',
                'message', '{LEASE_EXPIRED_MESSAGE}',
                'traceback', '',
                'worker', split_part(j.locked_by, '#', 1))) END"""
_RETURNED = """
SELECT id, name, queue, payload, priority, attempts, max_attempts, key, fingerprint, enqueued_at,
       started_at, CASE WHEN errors = '[]' THEN NULL ELSE errors END,
       (key IS NOT NULL OR attempts > 1) AND EXISTS (
           SELECT 1 FROM django_jobs_marker AS m
           WHERE m.key = COALESCE(claimed.key, claimed.id::text)
       ) AS completed,
       dependents, run_at, trace_context
FROM claimed
ORDER BY priority DESC, run_at, id
"""


# Lease up to %(limit)s jobs of %(queues)s to %(token)s, counting an attempt each.
#
# - Per queue, jobs whose lease expired (their worker was killed, hung or cut
#   off) are taken over first, then due jobs in claim order (priority, run_at,
#   id) along django_jobs_job_claim. Taking over an expired lease notes the lost
#   attempt in the job's errors; it needs no task for the user to schedule.
# - Candidates are locked with FOR UPDATE SKIP LOCKED in a MATERIALIZED CTE, so
#   the outer UPDATE cannot touch more rows than the LIMIT (the planner trap of
#   "UPDATE ... WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)"), and
#   the UPDATE re-checks the lease, so a job settled meanwhile is left alone.
# - The marker lookup rides along for the only jobs that can have one: those
#   with a dedupe key and those on a second attempt.
# - Only jobs whose name is in %(names)s (the handlers the worker has
#   registered; NULL: any name) are taken, so a worker of an older release never
#   touches the jobs of a handler it lacks: they wait for a worker that has it
#   (see worker/upkeep.py for those no live worker knows). The name is not in the
#   index: it is a filter on the rows the index walk visits, as %(exclude)s is.
# - Paused queues (django_jobs_queue.paused) are left out, and when %(beat)s
#   the worker's heartbeat row is refreshed: a waiting worker makes this one
#   round trip per poll and no other.
# - The lost attempt's entry has the shape of attempts.lease_expired_entry
#   (tests/test_claim.py pins it), its texts spliced in from there.
# A queue's expired leases, oldest first: the part of `claimable` that CLAIM and
# aging.CLAIMABLE both take first (spliced in as `{expired}`, its `{skip}` filled).
_EXPIRED = """SELECT id FROM django_jobs_job
            WHERE locked_by IS NOT NULL AND queue = q.name
              AND lease_expires_at < statement_timestamp()
              AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
              {skip}
            ORDER BY lease_expires_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED"""
# A queue's due jobs in claim order, passing over locked rows: the other part of
# `claimable` (CLAIM's, and aging.CLAIMABLE's top-up, which also skips what it picked).
_DUE = """SELECT id FROM django_jobs_job
            WHERE locked_by IS NULL
              AND queue = q.name
              AND run_at <= statement_timestamp()
              AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
              AND name <> ALL(%(exclude)s::text[])
              {skip}
            ORDER BY priority DESC, run_at, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED"""
_CLAIMABLE = """claimable AS MATERIALIZED (
    SELECT candidate.id
    FROM active AS q
    CROSS JOIN LATERAL (
        SELECT id FROM (
            {expired}
        ) AS expired
        UNION ALL
        SELECT id FROM (
            {due}
        ) AS due
    ) AS candidate
    LIMIT %(limit)s
),"""


def _claimed(picked: str, *, partition: bool) -> str:
    # The `claimed` CTE of every claim: lease the jobs the CTE `picked` names, the
    # lease re-checked (a job settled or taken meanwhile is left alone), returning
    # what the worker runs (the limited claim also the partition it counted).
    returned = "j.partition, " if partition else ""
    return f"""claimed AS (
    UPDATE django_jobs_job AS j{_LEASE}
    FROM {picked}
    WHERE j.id = {picked}.id
      AND (j.locked_by IS NULL OR j.lease_expires_at < statement_timestamp())
    RETURNING j.id, j.name, j.queue, j.payload, j.priority, j.run_at, j.attempts,
              j.max_attempts, j.key, j.fingerprint, j.enqueued_at, j.started_at, j.errors,
              {returned}j.dependents, j.trace_context
)"""  # noqa: S608 - spliced: constants of this module and attempts.py, no input


def _claim(*, except_limited: bool, aged: bool = False) -> str:
    # With limits configured, the limited names are left out of both branches
    # (%(limited)s): CLAIM_LIMITED claims them. Without, the statement is as it was.
    # `aged`: priority aging's `claimable` (store/aging.py) instead of this one.
    skip = "AND name <> ALL(%(limited)s::text[])" if except_limited else ""
    expired = _EXPIRED.format(skip=skip)
    if aged:
        claimable = aging.CLAIMABLE.format(
            skip=skip, expired=expired, due=_DUE.format(skip=skip + aging.NOT_PICKED)
        )
    else:
        claimable = _CLAIMABLE.format(expired=expired, due=_DUE.format(skip=skip))
    return f"""
WITH {"RECURSIVE " if aged else ""}beat AS (
    UPDATE django_jobs_worker
    SET last_seen_at = statement_timestamp(), running = %(running)s,
        stats = COALESCE(%(stats)s::jsonb, stats)
    WHERE %(beat)s AND id = %(worker)s
),
active AS MATERIALIZED (
    SELECT q.name, q.position
    FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, position)
    WHERE NOT EXISTS (SELECT 1 FROM django_jobs_queue AS s WHERE s.name = q.name AND s.paused)
),
{claimable}
{_claimed("claimable", partition=False)}{_RETURNED}"""  # noqa: S608 - spliced: constants of this module and attempts.py, no input


CLAIM = _claim(except_limited=False)
# CLAIM without the jobs of limited groups (%(limited)s names; limited queues are not
# in %(queues)s): the unlimited half of a claim when limits are configured.
CLAIM_UNLIMITED = _claim(except_limited=True)
# The two with priority aging on (DJANGO_JOBS["PRIORITY_AGING"]; %(aging)s: its seconds).
CLAIM_AGED = _claim(except_limited=False, aged=True)
CLAIM_UNLIMITED_AGED = _claim(except_limited=True, aged=True)

# The current window's start on the database clock: fixed windows aligned to the epoch.
_WINDOW_START = (
    "to_timestamp(floor(extract(epoch FROM statement_timestamp()) / %(window)s::int)"
    " * %(window)s::int)"
)
_PART = "CASE WHEN %(partitioned)s::boolean THEN COALESCE(partition, '') ELSE '' END"


# CLAIM_LIMITED's ranking of its candidates per partition, and the rows it takes
# within each partition's room (see _claim_limited).
_LIMITED_PICK = """ranked AS MATERIALIZED (
    SELECT c.id, c.expired, c.priority, c.run_at,
           row_number() OVER (
               PARTITION BY c.part ORDER BY c.expired DESC, c.priority DESC, c.run_at, c.id
           ) AS rank,
           LEAST(COALESCE(%(cap)s::int - COALESCE(r.n, 0), %(limit)s::int),
                 COALESCE(%(rate)s::int - COALESCE(w.starts, 0), %(limit)s::int)) AS room
    FROM candidates AS c
    LEFT JOIN running AS r ON r.part = c.part
    LEFT JOIN flow_window AS w ON w.part = c.part
),
picked AS MATERIALIZED (
    SELECT j.id
    FROM ranked JOIN django_jobs_job AS j ON j.id = ranked.id
    WHERE ranked.rank <= ranked.room
    ORDER BY ranked.expired DESC, ranked.priority DESC, ranked.run_at, ranked.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
"""


def _limited_room(column: str) -> str:
    """The first CTEs of CLAIM_LIMITED: the worker's unpaused queues, the group's running
    jobs and starts in the current window, and its room (see _claim_limited)."""
    return f"""WITH active AS MATERIALIZED (
    SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM django_jobs_queue AS s WHERE s.name = q.name AND s.paused)
),
running AS MATERIALIZED (
    SELECT {_PART} AS part, count(*) AS n
    FROM django_jobs_job
    WHERE locked_by IS NOT NULL AND lease_expires_at >= statement_timestamp()
      AND {column} = %(value)s AND name <> ALL(%(limited)s::text[])
    GROUP BY 1
),
flow_window AS MATERIALIZED (
    SELECT partition AS part, max(starts) AS starts FROM django_jobs_flow_window
    WHERE key = ANY(%(window_keys)s::text[]) AND window_start = {_WINDOW_START}
    GROUP BY partition
),
room AS MATERIALIZED (
    SELECT CASE WHEN %(partitioned)s::boolean THEN %(scan)s::int ELSE GREATEST(0, LEAST(
        %(limit)s::int,
        %(cap)s::int - (SELECT COALESCE(sum(n), 0) FROM running),
        %(rate)s::int - (SELECT COALESCE(sum(starts), 0) FROM flow_window)))::int END AS n
),
"""  # noqa: S608 - spliced: constants of this module, no input


def _claim_limited(column: str) -> str:
    # One limited group (its handler's name or its queue, `column` = %(value)s),
    # under the group's FLOW_LOCK, which must be granted before this statement
    # starts (its snapshot then holds every lease a previous holder committed):
    # - running: its leased rows whose lease has not expired, per partition;
    # - window: its starts in the current fixed window of its own length, per
    #   partition: the counter of that length (%(window_keys)s; flow.COUNTED_WINDOWS)
    #   or the group's plain one of the release before, whichever counted more;
    # - room: how many an unpartitioned group can start now, min(limit, cap -
    #   running, rate - starts) (LEAST ignores a missing limit's NULL); a
    #   partitioned group's room is per partition, known only after ranking: %(scan)s;
    # - candidates: per unpaused queue of the worker (a walk of its claim index, in
    #   claim order, that stops at that many), at most that many of its expired
    #   leases and of its due jobs, of names it knows and not capped in this
    #   process (none read when the group is full); ranked per partition, expired
    #   leases first;
    # - picked: those whose rank is within the partition's room,
    #   min(cap - running, rate - starts), locked with SKIP LOCKED;
    # - claimed: leased as by CLAIM; counted: their starts added to the counters of
    #   every window length (%(counters)s, %(lengths)s), each rolled to its current
    #   window, whatever the claimer's own limit.
    # A queue's group leaves out the names that have limits of their own (%(limited)s).
    return f"""
{_limited_room(column)}candidates AS MATERIALIZED (
    SELECT c.* FROM active AS q CROSS JOIN LATERAL (
        (SELECT id, {_PART} AS part, true AS expired, priority, run_at
         FROM django_jobs_job
         WHERE locked_by IS NOT NULL AND lease_expires_at < statement_timestamp()
           AND queue = q.name AND {column} = %(value)s
           AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
           AND name <> ALL(%(exclude)s::text[]) AND name <> ALL(%(limited)s::text[])
         ORDER BY lease_expires_at
         LIMIT (SELECT n FROM room))
        UNION ALL
        (SELECT id, {_PART} AS part, false AS expired, priority, run_at
         FROM django_jobs_job
         WHERE locked_by IS NULL AND run_at <= statement_timestamp()
           AND queue = q.name AND {column} = %(value)s
           AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
           AND name <> ALL(%(exclude)s::text[]) AND name <> ALL(%(limited)s::text[])
         ORDER BY priority DESC, run_at, id
         LIMIT (SELECT n FROM room))
    ) AS c
),
{_LIMITED_PICK}{_claimed("picked", partition=True)},
counted AS (
    INSERT INTO django_jobs_flow_window (key, partition, window_start, starts)
    SELECT w.key, c.part,
           to_timestamp(floor(extract(epoch FROM statement_timestamp()) / w.seconds) * w.seconds),
           c.n
    FROM (SELECT {_PART} AS part, count(*) AS n FROM claimed
          WHERE %(rate)s::int IS NOT NULL GROUP BY 1) AS c
    CROSS JOIN unnest(%(counters)s::text[], %(lengths)s::int[]) AS w(key, seconds)
    ON CONFLICT (key, partition) DO UPDATE
    SET starts = CASE WHEN django_jobs_flow_window.window_start = EXCLUDED.window_start
                      THEN django_jobs_flow_window.starts + EXCLUDED.starts
                      ELSE EXCLUDED.starts END,
        window_start = EXCLUDED.window_start
){_RETURNED}"""  # noqa: S608 - spliced: constants of this module and attempts.py, no input


CLAIM_LIMITED = {"name": _claim_limited("name"), "queue": _claim_limited("queue")}


def claim_limited_params(
    group: flow.Limit, claim: dict[str, Any], limited: Sequence[str]
) -> dict[str, Any]:
    """Return the parameters of CLAIM_LIMITED[group.kind]: claim_params' and the group's.

    `limited` names the handlers with limits of their own (a queue's group leaves them out).
    """
    counters, lengths = group.counters_written()
    return {
        **claim,
        "value": group.value,
        "key": group.key,
        "limited": list(limited) if group.kind == "queue" else [],
        "cap": group.concurrency,
        "rate": group.rate.count if group.rate else None,
        "window": group.rate.seconds if group.rate else 1,
        "window_keys": group.counters_read(),
        "counters": counters,
        "lengths": lengths,
        "partitioned": group.partitioned,
        "scan": flow.SCAN,
    }


def claim_params(
    queues: Sequence[str],
    limit: int,
    token: str,
    lease: float,
    exclude: Sequence[str] | None = None,
    beat: Any = None,
    names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Return the parameters of CLAIM (`beat`: a models.Beat, or None; `names`: None for any)."""
    return {  # lists: psycopg adapts a list, not any sequence, to an array
        "queues": list(queues),
        "limit": max(limit, 0),
        "token": token,
        "lease": float(lease),
        "exclude": list(exclude or []),
        "names": None if names is None else list(names),
        "beat": beat is not None,
        "worker": beat.worker if beat else "",
        "running": beat.running if beat else 0,
        "stats": beat.stats if beat else None,
    }


# The marker of each row a `deleted` CTE returns (the job's columns, its lease
# token and its result), written in the same statement as the delete. A marker
# that exists already (the work was done by an earlier attempt) is kept.
MARK_DELETED = """
    INSERT INTO django_jobs_marker
        (job_id, key, name, queue, attempts, enqueued_at, started_at, completed_at,
         worker_id, result, fingerprint, progress)
    SELECT id, COALESCE(key, id::text), name, queue, attempts, enqueued_at, started_at,
           statement_timestamp(),
           split_part(locked_by, '#', 1), result, fingerprint, progress
    FROM deleted
    ON CONFLICT DO NOTHING
"""


# Workflows (docs/workflows.md): satisfy the unsatisfied edges of the parent keys
# %(keys)s (a `keys` CTE, or the keys given) and count their dependents down by
# the edges satisfied now; a dependent whose count reaches 0 is released: due now,
# or its release_delay from now and not before its not_before (its own delay or
# run_at), and its queue's workers are woken at commit. The dependents are locked in id
# order first, so that two settles releasing the same jobs cannot deadlock. An
# edge is satisfied once: a concurrent settle of the same key waits for the edge's
# row lock and then finds it satisfied. The key lookup is an array (an InitPlan):
# no keys, no index scan, nothing read.
def _release(keys: str) -> str:
    return f"""
satisfied AS (
    UPDATE django_jobs_dependency
    SET satisfied_at = statement_timestamp()
    WHERE parent_key = ANY(ARRAY({keys})) AND satisfied_at IS NULL
    RETURNING job_id
),
counted AS MATERIALIZED (
    SELECT c.job_id, c.n FROM (
        SELECT job_id, count(*)::int AS n FROM satisfied GROUP BY job_id
    ) AS c
    JOIN django_jobs_job AS d ON d.id = c.job_id
    ORDER BY c.job_id
    FOR UPDATE OF d
),
released AS (
    UPDATE django_jobs_job AS d
    SET waiting_for = d.waiting_for - counted.n,
        -- GREATEST ignores NULLs: a row without not_before is due after its delay.
        run_at = CASE WHEN d.waiting_for - counted.n <= 0
                      THEN GREATEST(statement_timestamp()
                                    + COALESCE(d.release_delay, interval '0'), d.not_before)
                      ELSE d.run_at END
    FROM counted
    WHERE d.id = counted.job_id
    RETURNING d.queue, d.waiting_for <= 0 AND d.run_at <= statement_timestamp() AS due
),
woken AS (
    SELECT DISTINCT queue FROM released WHERE due
)"""  # noqa: S608 - spliced: constants of this module, no input


# Two CTEs: `kin`, the jobs %(ids)s (an `ids` query) and the jobs their settle
# may release (the open edges on the keys of those with dependents), and
# `family`, those locked in id order, as an enqueue after several parents locks
# them (store/parents.py, find_parents). A settle that locked its batch, then the jobs it
# releases, could meet an enqueue naming one of each and deadlock, but only when
# a released job's id sorts before a batch job's: with `crossed_only` nothing is
# locked otherwise (the batch and then the released jobs are then in id order
# already), and only the kin up to the batch's last id when so (the rest come
# after it anyway). Without it, `family` holds all the kin as locked (latest).
def _lock_family(ids: str, *, crossed_only: bool) -> str:
    last_own = "(SELECT id FROM kin WHERE own ORDER BY id DESC LIMIT 1)"
    first_other = "(SELECT id FROM kin WHERE NOT own ORDER BY id LIMIT 1)"
    crossed = (
        f"\n    WHERE j.id <= {last_own} AND {first_other} < {last_own}" if crossed_only else ""
    )
    return f"""
kin AS MATERIALIZED (
    SELECT batch.id, true AS own FROM ({ids}) AS batch(id)
    UNION ALL
    SELECT e.job_id, false FROM django_jobs_dependency AS e
    WHERE e.satisfied_at IS NULL AND e.parent_key = ANY(ARRAY(
        SELECT COALESCE(p.key, p.id::text) FROM django_jobs_job AS p
        WHERE p.id IN ({ids}) AND p.dependents > 0
    ))
),
family AS MATERIALIZED (
    SELECT j.id, j.locked_by, j.dependents
    FROM (SELECT DISTINCT id FROM kin) AS k
    JOIN django_jobs_job AS j ON j.id = k.id{crossed}
    ORDER BY j.id
    FOR UPDATE OF j
)"""  # noqa: S608 - spliced: constants of this module, no input


# Settle a batch of finished jobs: delete each row still leased to its token and
# write its completion marker, in one statement. The batch comes as one JSON
# array of {"i", "id", "token", "d", "result"} (cheaper to build and to bind than
# arrays), "d" being the job's dependents as its claim returned them. A marker
# that exists already (the work was done by an earlier attempt) is kept.
# The fence (j.dependents = f.d): a dependent registered after the claim may have
# committed after this statement's snapshot, its edge invisible here; such a row
# is left alone, and the caller settles it again after locking it (LOCK_SETTLING).
# Returns the positions in the batch of the jobs settled.
def _complete(*, release: bool) -> str:
    # COMPLETE_RELEASING: the jobs deleted with dependents release them (_release),
    # and a NULL row is returned per queue that has jobs made due, notified when
    # %(notify)s. COMPLETE, for a batch claimed without any dependents, leaves that
    # part out: the fence alone keeps it exact, and it plans and runs as before.
    keys = "SELECT COALESCE(key, id::text) FROM deleted WHERE dependents > 0"
    # COMPLETE_RELEASING keeps its locks in id order with the jobs it may release
    # (_lock_family); the DELETE's one-time filter reads `family` whole before the
    # DELETE locks anything. Edges committed after this statement's snapshot
    # changed their parent's dependents: the fence leaves that parent.
    family = _lock_family("SELECT id FROM finished", crossed_only=True)
    locking = f",{family}" if release else ""
    gate = "\n      AND (SELECT count(*) FROM family) >= 0" if release else ""
    tail = (
        f""",{_release(keys)}
SELECT i, NULL FROM deleted
UNION ALL
SELECT NULL, CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue) END FROM woken
"""  # noqa: S608 - spliced: _release, no input
        if release
        else "\nSELECT i FROM deleted\n"
    )
    return f"""
WITH finished AS (
    SELECT * FROM json_to_recordset(%(batch)s::json)
        AS f(i int, id uuid, token text, d int, result jsonb)
){locking},
deleted AS (
    DELETE FROM django_jobs_job AS j
    USING finished AS f
    WHERE j.id = f.id AND j.locked_by = f.token AND j.dependents = f.d{gate}
    RETURNING f.i, j.id, j.key, j.name, j.queue, j.attempts, j.enqueued_at, j.started_at,
              j.fingerprint, j.locked_by, f.result, j.dependents, j.progress
),
marked AS ({MARK_DELETED}){tail}"""  # noqa: S608 - spliced: MARK_DELETED and _release, no input


COMPLETE = _complete(release=False)
COMPLETE_RELEASING = _complete(release=True)

# The rows of a batch COMPLETE left alone (its fence, or a lease lost), locked in
# id order inside a transaction: the COMPLETE that follows sees every edge
# committed before the lock was granted, and no dependent can register meanwhile.
LOCK_SETTLING = f"""
WITH {_lock_family("SELECT unnest(%(ids)s::uuid[])", crossed_only=False)}
SELECT id, locked_by, dependents FROM family
WHERE id = ANY(%(ids)s::uuid[]) AND locked_by = ANY(%(tokens)s::text[])
"""  # noqa: S608 - spliced: _lock_family, no input


# The release of COMPLETE on its own, for the keys %(keys)s: an atomic handler's
# settle runs it in the handler's transaction after COMPLETE_ATOMIC deleted a job
# that had dependents. Returns how many jobs it made due.
RELEASE = f"""
WITH {_release("SELECT unnest(%(keys)s::text[])")}
SELECT (SELECT count(*) FROM released WHERE due),
       (SELECT count(CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue) END) FROM woken)
"""  # noqa: S608 - spliced: _release, no input


# Settle one job inside an atomic handler's own transaction: delete it if still
# leased to the token and write its marker. Returns (deleted, marked, dependents):
# 0 deleted means the lease was taken over; 0 marked means the key's marker exists
# (the work was done before): either way the caller rolls its transaction back.
# The DELETE returns the row's latest dependents (it waits for a registering
# enqueue to commit); when above 0 the caller runs RELEASE next, in a statement
# whose snapshot sees their edges.
def _complete_atomic(*, lock: bool) -> str:
    # COMPLETE_ATOMIC_LOCKING, for a job that had dependents at its claim: its locks
    # and those of the jobs RELEASE will count down go in id order (_lock_family),
    # read whole by the DELETE's one-time filter.
    family = _lock_family("SELECT %(id)s::uuid", crossed_only=True)
    locking = f"{family},\n" if lock else ""
    gate = " AND (SELECT count(*) FROM family) >= 0" if lock else ""
    return f"""
WITH {locking}deleted AS (
    DELETE FROM django_jobs_job
    WHERE id = %(id)s AND locked_by = %(token)s{gate}
    RETURNING id, key, name, queue, attempts, enqueued_at, started_at, fingerprint, locked_by,
              %(result)s::jsonb AS result, dependents, progress
),
marked AS ({MARK_DELETED}    RETURNING job_id
)
SELECT (SELECT count(*) FROM deleted), (SELECT count(*) FROM marked),
       (SELECT COALESCE(sum(dependents), 0) FROM deleted)
"""  # noqa: S608 - spliced: MARK_DELETED and _lock_family, no input


COMPLETE_ATOMIC = _complete_atomic(lock=False)
COMPLETE_ATOMIC_LOCKING = _complete_atomic(lock=True)

# Heartbeat: push the leases of the jobs this worker still holds (never shortening
# one a handler extended further itself), and say which of them an operator
# asked to cancel.
EXTEND_LEASES = """
UPDATE django_jobs_job
SET lease_expires_at = GREATEST(lease_expires_at, statement_timestamp() + %s * interval '1 second')
WHERE id = ANY(%s::uuid[]) AND locked_by = ANY(%s::text[])
RETURNING id, cancel_requested_at IS NOT NULL
"""

# Enqueue one job without a dedupe key. %(channel)s is notified at commit when
# the job is due now, so that a listening worker claims it at once. (A plain
# INSERT ... RETURNING pg_notify() plans cheaper than a CTE: E1 is all round trip.)
INSERT = """
INSERT INTO django_jobs_job
    (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts, errors,
     partition, trace_context, tags, meta)
VALUES (%(id)s, %(name)s, %(queue)s, %(payload)s, %(priority)s,
        COALESCE(%(run_at)s, statement_timestamp() + %(delay)s * interval '1 second'),
        statement_timestamp(), 0, %(max_attempts)s, '[]', %(partition)s, %(trace_context)s,
        %(tags)s::jsonb, %(meta)s::jsonb)
RETURNING CASE WHEN %(notify)s AND run_at <= statement_timestamp()
    THEN pg_notify(%(channel)s, queue) END, enqueued_at
"""

# Enqueue one job with a dedupe key, unless the key has a live job or a
# completion marker. The ON CONFLICT target is the partial unique index on key,
# so two concurrent enqueues of one key make one row. Returns what happened:
# ("inserted", id, NULL, _, enqueued_at, recheck) or ("completed", marker's job id,
# fingerprint, NULL, NULL, false); no row means a live job holds the key (look it up).
# Jobs may wait for the key already (after= a dead letter of it): the new job counts
# them as its dependents, so that its settle releases them (docs/workflows.md).
INSERT_KEYED = """
WITH completed AS (
    SELECT job_id, fingerprint FROM django_jobs_marker WHERE key = %(key)s
),
inserted AS (
    INSERT INTO django_jobs_job
        (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts,
         key, fingerprint, errors, partition, trace_context, tags, meta, dependents)
    SELECT %(id)s, %(name)s, %(queue)s, %(payload)s, %(priority)s,
           COALESCE(%(run_at)s, statement_timestamp() + %(delay)s * interval '1 second'),
           statement_timestamp(), 0, %(max_attempts)s, %(key)s, %(fingerprint)s, '[]',
           %(partition)s, %(trace_context)s, %(tags)s::jsonb, %(meta)s::jsonb,
           (SELECT count(*) FROM django_jobs_dependency
            WHERE parent_key = %(key)s AND satisfied_at IS NULL)
    WHERE NOT EXISTS (SELECT 1 FROM completed)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id, queue, run_at <= statement_timestamp() AS due, enqueued_at
)
SELECT 'inserted', id, NULL, CASE WHEN due AND %(notify)s THEN pg_notify(%(channel)s, queue) END,
       enqueued_at,
       -- A live job held the key as this statement began, yet the insert went in: that
       -- job settled while the insert waited for it, maybe writing a marker this
       -- statement cannot see. The caller looks again (MARKER_OF_KEY).
       EXISTS (SELECT 1 FROM django_jobs_job WHERE key = %(key)s)
FROM inserted
UNION ALL
SELECT 'completed', job_id, fingerprint, NULL, NULL, false FROM completed
"""

# The completion marker of a key, read after INSERT_KEYED (a statement of its own:
# a snapshot taken after the insert's wait).
MARKER_OF_KEY = "SELECT job_id, fingerprint FROM django_jobs_marker WHERE key = %s"

# Bulk enqueue of jobs without keys: COPY is the fast path (rows come ready-made,
# ids from the client, times from one statement_timestamp() of the same transaction).
COPY_JOBS = """
COPY django_jobs_job
    (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts, errors,
     partition, trace_context, tags, meta)
FROM STDIN
"""

# The steps of a workflow (store/workflows.py, insert_workflow): COPY_JOBS with the
# counts of parents not finished and of dependents in the same workflow, and a
# blocked step's own timing for its release.
COPY_STEPS = """
COPY django_jobs_job
    (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts, errors,
     partition, trace_context, tags, meta, waiting_for, dependents, release_delay, not_before)
FROM STDIN
"""

# A workflow's edges and its steps' rows (store/workflows.py, insert_workflow).
COPY_EDGES = """
COPY django_jobs_dependency
    (job_id, parent_key, parent_id, on_parent_dead, created_at, satisfied_at)
FROM STDIN
"""
COPY_WORKFLOW_STEPS = """
COPY django_jobs_workflow_step (job_id, workflow, name, key, created_at) FROM STDIN
"""

# The new jobs of a chunk of replayed dead letters (store/replay.py),
# one statement for the chunk: one array per column, one element per job. A key
# with a completion marker, or held by a live job, makes no row (ON CONFLICT on
# the partial unique index, as INSERT_KEYED); the caller looked for both under the
# letters' row locks, and compares the ids returned with those it sent. Returns
# (id, queue when due now, recheck): recheck as in INSERT_KEYED, a live job held
# the key as the statement began (it settled while the insert waited for it).
INSERT_REPLAYS = """
WITH inserted AS (
    INSERT INTO django_jobs_job
        (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts,
         key, fingerprint, errors, partition, waiting_for, dependents, release_delay,
         not_before, trace_context, tags, meta)
    SELECT r.id, r.name, r.queue, r.payload, r.priority,
           COALESCE(r.run_at, statement_timestamp() + r.delay * interval '1 second'),
           statement_timestamp(), 0, r.max_attempts, r.key, r.fingerprint, '[]',
           r.partition, r.waiting_for, r.dependents, r.release_delay, r.not_before,
           r.trace_context, r.tags::jsonb, r.meta::jsonb
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(queue)s::text[], %(payload)s::text[],
                %(priority)s::int[], %(run_at)s::timestamptz[], %(delay)s::float8[],
                %(max_attempts)s::int[], %(key)s::text[], %(fingerprint)s::text[],
                %(partition)s::text[], %(waiting_for)s::int[], %(dependents)s::int[],
                %(release_delay)s::interval[], %(not_before)s::timestamptz[],
                %(trace_context)s::text[], %(tags)s::text[], %(meta)s::text[])
        AS r(id, name, queue, payload, priority, run_at, delay, max_attempts, key,
             fingerprint, partition, waiting_for, dependents, release_delay, not_before,
             trace_context, tags, meta)
    WHERE r.key IS NULL OR NOT EXISTS (SELECT 1 FROM django_jobs_marker m WHERE m.key = r.key)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id, key, queue, run_at <= statement_timestamp() AS due
)
SELECT i.id, CASE WHEN i.due THEN i.queue END,
       i.key IS NOT NULL AND EXISTS (SELECT 1 FROM django_jobs_job j WHERE j.key = i.key)
FROM inserted i
"""

# Mark a chunk of replayed letters (locked by the replay) with their new jobs, and
# move their workflow steps to those jobs, with the jobs' keys: arrays in, one
# statement each, where a CASE per letter would cost the planner a branch per row.
MARK_REPLAYED = """
UPDATE django_jobs_deadletter d
SET replayed_at = statement_timestamp(), replayed_by = %(by)s, replay_job_id = r.job_id
FROM unnest(%(letters)s::uuid[], %(jobs)s::uuid[]) AS r(letter, job_id)
WHERE d.id = r.letter AND d.replayed_at IS NULL
"""
MOVE_REPLAYED_STEPS = """
UPDATE django_jobs_workflow_step s
SET job_id = r.job_id, key = r.key
FROM unnest(%(letters)s::uuid[], %(jobs)s::uuid[], %(keys)s::text[]) AS r(letter, job_id, key)
WHERE s.job_id = r.letter
"""

# Wake listening workers of a queue (after a replay or "run now", say).
NOTIFY = "SELECT pg_notify(%s, %s)"
# Send each payload of an array on a channel, in one round trip (flow control's freed slots).
NOTIFY_EACH = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"


def dead_rows(alias: str, table: str) -> int:
    """Dead rows of table beyond its live ones, as the statistics collector counts them."""
    if cast("PostgresWrapper", connections[alias]).pg_version >= 150000:
        # This session's own deletes reach the statistics at its next report: force it.
        run(alias, "SELECT pg_stat_force_next_flush()")
    rows = run(
        alias,
        "SELECT n_dead_tup - n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
        [table],
    )
    return int(rows[0][0]) if rows else 0


def vacuum(alias: str, table: str) -> None:
    """VACUUM table, unless another session is vacuuming it already (SKIP_LOCKED)."""
    connection = connections[alias]
    with connection.cursor() as cursor:  # autocommit: VACUUM cannot run in a transaction
        cursor.execute(f"VACUUM (SKIP_LOCKED) {connection.ops.quote_name(table)}")


def autovacuum_on(alias: str) -> bool:
    on: bool = run(alias, "SELECT current_setting('autovacuum') = 'on'")[0][0]
    return on
