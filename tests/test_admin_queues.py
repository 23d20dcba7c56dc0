"""The Queues page reads the live jobs once, in one grouped count, however many queues it lists.

It once annotated five correlated counts on every queue row, each reading the jobs
of its queue again: 1.6 s at 5 queues and 120,000 jobs, 9.6 s at 26.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs.models import Job, QueueState, blocked_until
from tests.admin_fixtures import url
from tests.conftest import POSTGRES
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

# The jobs table as its name appears in SQL, quoted by any of our engines.
JOBS_TABLE = re.compile(r"""FROM ["`]?django_jobs_job["`]?(?![_a-z])""")


def queue_page(client):
    """GET the Queues page; return the response, the SQL of its queries and the seconds."""
    client.get(url("queuestate_changelist"))  # warm: content types, templates
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        response = client.get(url("queuestate_changelist"))
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    return response, [q["sql"] for q in queries.captured_queries], elapsed


def shown_counts(response):
    return {
        row.name: (row.n_waiting, row.n_scheduled, row.n_running, row.n_blocked)
        for row in response.context["cl"].result_list
    }


def job_reads(sqls):
    """How often the page's queries name the jobs table (a correlated count is one each)."""
    return sum(len(JOBS_TABLE.findall(sql)) for sql in sqls)


def test_the_queries_do_not_grow_with_the_queues(admin_client_):
    now = timezone.now()
    QueueState.objects.ensure(["q0", "q1"])
    JobFactory(queue="q0", run_at=now - timedelta(seconds=5))
    few, few_sql, _ = queue_page(admin_client_)

    names = [f"q{i}" for i in range(20)]
    QueueState.objects.ensure(names)
    for i, name in enumerate(names):
        JobFactory.create_batch(1 + i % 3, queue=name, run_at=now - timedelta(seconds=5))
        JobFactory(queue=name, run_at=now + timedelta(hours=1))
    many, many_sql, _ = queue_page(admin_client_)

    assert len(shown_counts(many)) == 20
    assert len(many_sql) == len(few_sql)
    # One grouped count of the jobs: the list of queues itself never reads the jobs.
    assert job_reads(many_sql) == job_reads(few_sql) == 1


def test_the_counts_shown_are_each_queues_own(admin_client_):
    now = timezone.now()
    QueueState.objects.ensure(["default", "emails", "idle", "steps"])
    JobFactory.create_batch(3, queue="emails", run_at=now - timedelta(seconds=30))
    JobFactory.create_batch(2, queue="emails", run_at=now + timedelta(hours=1))
    JobFactory(queue="emails", leased=True)
    JobFactory(queue="default", run_at=now - timedelta(seconds=5))
    JobFactory.create_batch(4, queue="steps", run_at=blocked_until(), waiting_for=1)
    JobFactory(queue="not-listed", run_at=now - timedelta(seconds=5))  # no QueueState row
    response, _sql, _ = queue_page(admin_client_)
    assert shown_counts(response) == {
        "default": (1, 0, 0, 0),
        "emails": (3, 2, 1, 0),
        "idle": (0, 0, 0, 0),
        "steps": (0, 0, 0, 4),
    }
    oldest = {row.name: row.oldest_run_at for row in response.context["cl"].result_list}
    assert oldest["idle"] is None and oldest["steps"] is None
    first = Job.objects.filter(queue="emails").order_by("run_at").first().run_at
    assert oldest["emails"] == first
    # And on the page: the counts in their columns, the oldest wait as a duration.
    text = response.text
    assert re.search(r'class="field-waiting">3<', text)
    assert re.search(r'class="field-scheduled">2<', text)
    assert re.search(r'class="field-blocked">4<', text)
    assert re.search(r'class="field-oldest_wait">(30|31|32|33|34|35)s<', text)


# ---- a realistic table (PostgreSQL): the planner's loops, not seconds ------------------------

JOBS = 120_000

FILL = """
INSERT INTO django_jobs_queue (name, paused, reason, paused_by)
SELECT 'queue-' || q, false, '', '' FROM generate_series(1, %(queues)s) AS q
ON CONFLICT DO NOTHING;

INSERT INTO django_jobs_job
    (id, name, queue, payload, priority, run_at, enqueued_at, attempts, max_attempts, errors)
SELECT gen_random_uuid(), 'tests.noop', 'queue-' || (1 + g %% %(queues)s), '{}', 0,
       now() + (g %% 7 - 3) * interval '1 minute', now(), 0, 3, '[]'::jsonb
FROM generate_series(1, %(jobs)s) AS g;

ANALYZE django_jobs_job;
ANALYZE django_jobs_queue;
"""


def job_scan_loops(sql):
    """How many times EXPLAIN ANALYZE saw the jobs table scanned while running sql."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")  # loops = scans
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        [[plan]] = cursor.fetchone()
        cursor.execute("RESET max_parallel_workers_per_gather")
    loops, nodes = 0, [plan["Plan"]]
    while nodes:
        node = nodes.pop()
        if node.get("Relation Name") == "django_jobs_job":
            loops += node["Actual Loops"]
        nodes.extend(node.get("Plans", ()))
    return loops


@pytest.mark.postgres
@pytest.mark.slow
def test_the_jobs_table_is_read_once_at_5_and_26_queues(admin_client_, capsys):
    assert POSTGRES
    figures = []
    for queues in (5, 26):
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM django_jobs_job")
            cursor.execute(FILL, {"queues": queues, "jobs": JOBS})
        response, sqls, elapsed = queue_page(admin_client_)
        shown = shown_counts(response)
        assert len(shown) == queues
        assert sum(sum(counts) for counts in shown.values()) == JOBS
        per_queue = {
            row["queue"]: (row["waiting"], row["scheduled"], row["running"], row["blocked"])
            for row in Job.objects.counts_by_queue()
        }
        assert shown == per_queue
        loops = sum(job_scan_loops(sql) for sql in sqls if sql.startswith("SELECT"))
        figures.append((queues, elapsed, len(sqls), loops, len(response.content)))
    with capsys.disabled():
        for queues, elapsed, n, loops, size in figures:
            print(
                f"\n[queues page] {queues} queues, {JOBS:,} jobs: {elapsed * 1000:.0f} ms, "
                f"{n} queries, jobs table scanned {loops}x, {size:,} bytes",
                end="",
            )
        print()
    assert [loops for _q, _s, _n, loops, _b in figures] == [1, 1]
    assert figures[0][2] == figures[1][2]  # as many queries at 26 queues as at 5
