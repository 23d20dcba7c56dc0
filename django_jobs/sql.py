"""PostgreSQL statements of the hot path, each one round trip and one transaction.

Kept here, named and commented, so that the SQL the worker runs thousands of
times a second can be read in one place. ``models.JobQuerySet`` runs them on
PostgreSQL and falls back to the ORM elsewhere. Times come from the database
clock (``now()``), never the worker's.
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
CLAIM = """
WITH claimable AS MATERIALIZED (
    SELECT candidate.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id FROM (
            SELECT id FROM django_jobs_job
            WHERE locked_by IS NOT NULL AND queue = q.name AND lease_expires_at < now()
            ORDER BY lease_expires_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS expired
        UNION ALL
        SELECT id FROM (
            SELECT id FROM django_jobs_job
            WHERE locked_by IS NULL
              AND queue = q.name
              AND run_at <= now()
              AND name <> ALL(%(exclude)s::text[])
            ORDER BY priority DESC, run_at, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS due
    ) AS candidate
    LIMIT %(limit)s
),
claimed AS (
    UPDATE django_jobs_job AS j
    SET attempts = j.attempts + 1,
        locked_by = %(token)s,
        lease_expires_at = now() + %(lease)s * interval '1 second',
        attempted_at = now(),
        started_at = COALESCE(j.started_at, now()),
        errors = CASE WHEN j.locked_by IS NULL THEN j.errors ELSE j.errors || jsonb_build_array(
            jsonb_build_object(
                'attempt', j.attempts,
                'at', now(),
                'type', 'django_jobs.LeaseExpired',
                'message', 'the lease expired before the attempt settled (worker killed, hung or cut off)',
                'traceback', '',
                'worker', split_part(j.locked_by, '#', 1))) END
    FROM claimable
    WHERE j.id = claimable.id
      AND (j.locked_by IS NULL OR j.lease_expires_at < now())
    RETURNING j.id, j.name, j.queue, j.payload, j.priority, j.run_at, j.attempts,
              j.max_attempts, j.key, j.fingerprint, j.enqueued_at, j.started_at, j.errors
)
SELECT claimed.*,
       (claimed.key IS NOT NULL OR claimed.attempts > 1) AND EXISTS (
           SELECT 1 FROM django_jobs_marker AS m
           WHERE m.key = COALESCE(claimed.key, claimed.id::text)
       ) AS completed
FROM claimed
"""

# Settle a batch of finished jobs: delete each row still leased to its token and
# write its completion marker, in one statement. A marker that exists already
# (the work was done by an earlier attempt) is kept. Returns the settled ids.
COMPLETE = """
WITH finished AS (
    SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS f(id, token, result)
),
deleted AS (
    DELETE FROM django_jobs_job AS j
    USING finished AS f
    WHERE j.id = f.id AND j.locked_by = f.token
    RETURNING j.id, j.key, j.name, j.queue, j.attempts, j.enqueued_at, j.started_at,
              j.fingerprint, j.locked_by, f.result
),
marked AS (
    INSERT INTO django_jobs_marker
        (job_id, key, name, queue, attempts, enqueued_at, started_at, completed_at,
         worker_id, result, fingerprint)
    SELECT id, COALESCE(key, id::text), name, queue, attempts, enqueued_at, started_at, now(),
           split_part(locked_by, '#', 1), result::jsonb, fingerprint
    FROM deleted
    ON CONFLICT DO NOTHING
)
SELECT id FROM deleted
"""

# Heartbeat: push the leases of the jobs this worker still holds (never shortening
# one a handler extended further itself).
EXTEND_LEASES = """
UPDATE django_jobs_job
SET lease_expires_at = GREATEST(lease_expires_at, now() + %s * interval '1 second')
WHERE id = ANY(%s::uuid[]) AND locked_by = ANY(%s::text[])
RETURNING id
"""

# Enqueue one job without a dedupe key. %(channel)s is notified at commit when
# the job is due now, so that a listening worker claims it at once.
INSERT = """
WITH inserted AS (
    INSERT INTO django_jobs_job
        (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts, errors)
    VALUES (%(id)s, %(name)s, %(queue)s, %(payload)s, %(priority)s,
            COALESCE(%(run_at)s, statement_timestamp() + %(delay)s * interval '1 second'),
            statement_timestamp(), 0, %(max_attempts)s, '[]')
    RETURNING queue, run_at <= statement_timestamp() AS due
)
SELECT pg_notify(%(channel)s, queue) FROM inserted WHERE due AND %(notify)s
"""

# Enqueue one job with a dedupe key, unless the key has a live job or a
# completion marker. The ON CONFLICT target is the partial unique index on key,
# so two concurrent enqueues of one key make one row. Returns what happened:
# ("inserted", id, NULL) or ("completed", marker's job id, fingerprint); no row
# means a live job holds the key (look it up).
INSERT_KEYED = """
WITH completed AS (
    SELECT job_id, fingerprint FROM django_jobs_marker WHERE key = %(key)s
),
inserted AS (
    INSERT INTO django_jobs_job
        (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts,
         key, fingerprint, errors)
    SELECT %(id)s, %(name)s, %(queue)s, %(payload)s, %(priority)s,
           COALESCE(%(run_at)s, statement_timestamp() + %(delay)s * interval '1 second'),
           statement_timestamp(), 0, %(max_attempts)s, %(key)s, %(fingerprint)s, '[]'
    WHERE NOT EXISTS (SELECT 1 FROM completed)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id, queue, run_at <= statement_timestamp() AS due
)
SELECT 'inserted', id, NULL, CASE WHEN due AND %(notify)s THEN pg_notify(%(channel)s, queue) END
FROM inserted
UNION ALL
SELECT 'completed', job_id, fingerprint, NULL FROM completed
"""

# Wake listening workers of a queue (after a replay or "run now", say).
NOTIFY = "SELECT pg_notify(%s, %s)"
