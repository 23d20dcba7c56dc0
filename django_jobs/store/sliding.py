"""The PostgreSQL claim of a group whose rate counts in a sliding window (docs/flow-control.md).

It is sql.CLAIM_LIMITED with two changes, made here by replacing their text (and
refused at import if that text is gone, so the two claims cannot drift apart):

- flow_window: the starts counted are those of the group's log of claims
  (django_jobs_flow_start) in the last `window` seconds up to this claim's time,
  ends included, or the fixed counters' (workers of a fixed window during the
  deploy that makes it sliding), whichever counted more;
- logged, pruned: the claim adds one row of its starts per partition to the log,
  at its statement's time (the jobs' started_at), and deletes the group's rows
  older than flow.KEEP_STARTS seconds (the longest window: no claim of any unit
  reads them). It still adds its starts to the fixed counters, which fixed-window
  workers and `jobs status` read.

The FLOW_LOCK serializes a group's claims and each claim's statement starts once
the lock is granted, after the previous holder committed: every start the claim
counts has an earlier time than its own, and every earlier start is counted. So a
claim at time t starts at most N minus the starts in [t - window, t], and no
interval of the window's length, ends included, ever holds more than N starts.
"""

from __future__ import annotations

from django_jobs import flow
from django_jobs.store import sql


def _replaced(statement: str, old: str, new: str) -> str:
    if statement.count(old) != 1:  # CLAIM_LIMITED changed: say so at import, not in a claim
        raise RuntimeError(f"store/sliding.py: CLAIM_LIMITED no longer holds {old[:60]!r}")
    return statement.replace(old, new)


_FIXED_WINDOW = f"""flow_window AS MATERIALIZED (
    SELECT partition AS part, max(starts) AS starts FROM django_jobs_flow_window
    WHERE key = ANY(%(window_keys)s::text[]) AND window_start = {sql._WINDOW_START}
    GROUP BY partition
),
"""  # noqa: S608 - spliced: constants of sql.py, no input
_SLIDING_WINDOW = f"""flow_window AS MATERIALIZED (
    SELECT part, max(starts) AS starts FROM (
        SELECT partition AS part, starts FROM django_jobs_flow_window
        WHERE key = ANY(%(window_keys)s::text[]) AND window_start = {sql._WINDOW_START}
        UNION ALL
        SELECT partition, sum(starts) FROM django_jobs_flow_start
        WHERE key = %(key)s
          AND started_at >= statement_timestamp() - %(window)s::int * interval '1 second'
        GROUP BY partition
    ) AS counters
    GROUP BY part
),
"""  # noqa: S608 - spliced: constants of sql.py, no input
_LOGGED = f"""),
logged AS (
    INSERT INTO django_jobs_flow_start (key, partition, started_at, starts)
    SELECT %(key)s, c.part, statement_timestamp(), count(*)
    FROM (SELECT {sql._PART} AS part FROM claimed) AS c
    GROUP BY c.part
),
pruned AS (
    DELETE FROM django_jobs_flow_start
    WHERE key = %(key)s
      AND started_at < statement_timestamp() - {flow.KEEP_STARTS} * interval '1 second'
){sql._RETURNED}"""  # noqa: S608 - spliced: constants of sql.py and flow.py, no input


def _sliding(statement: str) -> str:
    statement = _replaced(statement, _FIXED_WINDOW, _SLIDING_WINDOW)
    return _replaced(statement, f"){sql._RETURNED}", _LOGGED)


CLAIM_SLIDING = {kind: _sliding(statement) for kind, statement in sql.CLAIM_LIMITED.items()}


def claim_statement(group: flow.Limit) -> str:
    """Return the limited claim of group: CLAIM_SLIDING's if its window slides."""
    return (CLAIM_SLIDING if group.sliding else sql.CLAIM_LIMITED)[group.kind]
