"""The claim: exclusive under concurrency, in order, on its partial index, on the database clock."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import enqueue
from django_jobs.attempts import lease_expired_entry, lease_token, worker_of
from django_jobs.models import Job, blocked_until
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore
from tests.conftest import ENGINE, POSTGRES, ROOT, faketime_env
from tests.factories import JobFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request, settings):
    """Run each test on PostgreSQL's one-statement claim and on the ORM claim."""
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "CLAIM": request.param}
    return request.param


def test_concurrent_claims_never_share_a_job():
    for i in range(300):
        enqueue(jobs.noop, {"i": i})
    claimed: dict[str, list] = {}
    barrier = threading.Barrier(6)

    def claimer(n):
        barrier.wait()
        got = []
        while True:
            batch = JobStore().claim(
                ClaimRequest(queues=["default"], limit=7, token=f"w{n}#1", lease=60)
            )
            if not batch:
                break
            got.extend(j.id for j in batch)
        claimed[n] = got
        connection.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [job_id for got in claimed.values() for job_id in got]
    assert len(every) == 300
    assert len(set(every)) == 300  # no job handed to two claimers
    assert Job.objects.filter(attempts=1, locked_by__isnull=False).count() == 300


def test_claim_counts_the_attempt_and_sets_the_lease():
    enqueue(jobs.noop)
    [job] = JobStore().claim(
        ClaimRequest(queues=["default"], limit=5, token="host:1:ab#1", lease=30)
    )
    row = Job.objects.get()
    assert job.attempts == row.attempts == 1
    assert row.locked_by == "host:1:ab#1"
    assert timezone.now() + dt.timedelta(seconds=20) < row.lease_expires_at
    assert row.started_at is not None and row.attempted_at is not None
    assert job.worker_id == "host:1:ab"
    assert (
        JobStore().claim(ClaimRequest(queues=["default"], limit=5, token="other#1", lease=30)) == []
    )


def test_claim_respects_queues_limit_and_exclusions():
    for _ in range(3):
        enqueue(jobs.noop)
    enqueue(jobs.other_queue)
    assert (
        len(JobStore().claim(ClaimRequest(queues=["default"], limit=2, token="a#1", lease=30))) == 2
    )
    assert [
        j.queue
        for j in JobStore().claim(ClaimRequest(queues=["emails"], limit=9, token="b#1", lease=30))
    ] == ["emails"]
    assert (
        JobStore().claim(
            ClaimRequest(
                queues=["default"], limit=9, token="c#1", lease=30, exclude_names=["tests.noop"]
            )
        )
        == []
    )
    assert (
        len(JobStore().claim(ClaimRequest(queues=["default"], limit=9, token="d#1", lease=30))) == 1
    )


def test_claim_takes_only_the_names_it_is_given():
    noop = enqueue(jobs.noop)
    record = enqueue(jobs.record, {"label": "x"})
    expired = JobFactory(name="tests.new", lease_expired=True, worker="w:1:a")
    due = JobFactory(name="tests.new")
    assert (
        JobStore().claim(ClaimRequest(queues=["default"], limit=9, token="a#1", lease=30, names=[]))
        == []
    )
    taken = JobStore().claim(
        ClaimRequest(
            queues=["default"], limit=9, token="b#1", lease=30, names=["tests.noop", "tests.gone"]
        )
    )
    assert [j.id for j in taken] == [noop.id]
    # A lease that expired is taken over only by a worker that knows the name, too.
    assert Job.objects.get(id=expired.id).locked_by == "w:1:a#1"
    taken = JobStore().claim(
        ClaimRequest(queues=["default"], limit=9, token="c#1", lease=30, names=None)
    )
    assert {j.id for j in taken} == {record.id, expired.id, due.id}


def test_a_job_not_yet_due_is_not_claimed():
    enqueue(jobs.noop, delay=2)
    assert JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="a#1", lease=30)) == []


# Claims in a process of its own, on a skewed clock; prints its clock and the ids claimed.
CLAIM_ELSEWHERE = """
import json, time, django
django.setup()
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore
request = ClaimRequest(queues=["default"], limit=9, token="skewed:1:aa#1", lease=30)
claimed = JobStore().claim(request)
print(json.dumps({"clock": time.time(), "ids": sorted(str(job.id) for job in claimed)}))
"""


def _claim_on_a_clock(offset: str, claim_path: str) -> set[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
        "JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim_path}),
        **faketime_env(offset),
    }
    command = [sys.executable, "-c", CLAIM_ELSEWHERE]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    claim = json.loads(done.stdout.splitlines()[-1])
    # The skew took: the process's clock is `offset` away from this one's.
    skew = claim["clock"] - time.time()
    assert abs(skew - (600 if offset == "+10m" else -600)) < 60, skew
    return set(claim["ids"])


def _database_now():
    return Job.objects.annotate(db_now=Now()).values_list("db_now", flat=True)[:1].get()


@pytest.mark.skipif(ENGINE == "sqlite", reason="SQLite's clock is the worker process's own")
@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_claim_follows_the_database_clock_not_the_workers(claim_path, offset):
    five = dt.timedelta(minutes=5)
    due, not_due, held, abandoned = (
        JobFactory(),
        JobFactory(),
        JobFactory(leased=True, worker="alive:1:aa"),
        JobFactory(leased=True, worker="gone:1:aa"),
    )
    # Times set by the database's own clock: a worker ten minutes off must not go by its own.
    Job.objects.filter(id=due.id).update(run_at=Now() - five)
    Job.objects.filter(id=not_due.id).update(run_at=Now() + five)
    Job.objects.filter(id=held.id).update(lease_expires_at=Now() + five)
    Job.objects.filter(id=abandoned.id).update(lease_expires_at=Now() - five)
    before = _database_now()
    claimed = _claim_on_a_clock(offset, claim_path)
    after = _database_now()
    assert claimed == {str(due.id), str(abandoned.id)}
    assert Job.objects.get(id=held.id).locked_by == "alive:1:aa#1"
    rows = Job.objects.filter(id__in=[due.id, abandoned.id])
    assert len(rows) == 2
    for row in rows:
        assert row.locked_by == "skewed:1:aa#1"
        assert before <= row.attempted_at <= after
        lease = dt.timedelta(seconds=30)
        assert before + lease <= row.lease_expires_at <= after + lease


@pytest.mark.postgres
@pytest.mark.slow
def test_claim_uses_its_partial_index_on_a_big_table():
    with connection.cursor() as cursor:
        # 100,000 jobs, most of them scheduled for later, a few hundred due, some leased.
        cursor.execute(
            """
            INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, enqueued_at,
                                         attempts, max_attempts, errors)
            SELECT gen_random_uuid(), 'tests.noop',
                   CASE WHEN g % 10 = 0 THEN 'emails' ELSE 'default' END,
                   '{}', (g % 3) - 1,
                   CASE WHEN g % 200 = 1 THEN now() - interval '1 minute'
                        ELSE now() + interval '1 day' END,
                   now(), 0, 3, '[]'
            FROM generate_series(1, 100000) AS g
            """
        )
        cursor.execute("ANALYZE django_jobs_job")
        from django_jobs.store import sql

        names = ["tests.noop", *(f"app.handler_{i}" for i in range(40))]
        for known in (None, names):  # any name, or a worker's registered names
            cursor.execute(
                "EXPLAIN " + sql.CLAIM,
                sql.claim_params(["default"], 50, "t#1", 30, names=known),
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "django_jobs_job_claim" in plan, plan
            assert "Seq Scan on django_jobs_job" not in plan, plan
    claimed = JobStore().claim(
        ClaimRequest(queues=["default"], limit=50, token="t#1", lease=30, names=names)
    )
    assert len(claimed) == 50
    due = set(
        Job.objects.filter(id__in=[j.id for j in claimed], run_at__lt=timezone.now()).values_list(
            "id", flat=True
        )
    )
    assert due == {j.id for j in claimed}


def _rows_locked_by_this_transaction() -> int:
    # innodb_trx is a snapshot InnoDB refreshes at most every 0.1 s: wait for a fresh one.
    time.sleep(0.25)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT trx_rows_locked FROM information_schema.innodb_trx "
            "WHERE trx_mysql_thread_id = CONNECTION_ID()"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(ENGINE != "mariadb", reason="needs MariaDB: it counts InnoDB's row locks")
def test_a_claim_locks_the_due_jobs_not_the_blocked_workflow_steps():
    # A workflow's blocked steps wait in their queue with a run_at far ahead. A locking
    # read on MariaDB locks every row it passes, and a claim for more jobs than are due
    # passed (and locked) each blocked step of the queue on its way to the limit.
    blocked = 2_000
    steps = [JobFactory.build(run_at=blocked_until()) for _ in range(blocked)]
    Job.objects.bulk_create(steps, batch_size=500)
    due = {JobFactory().id, JobFactory().id}
    with transaction.atomic():
        claimed = JobStore().claim(ClaimRequest(queues=["default"], limit=4, token="w#1", lease=30))
        locked = _rows_locked_by_this_transaction()
    assert {j.id for j in claimed} == due
    assert locked < 50, f"{locked} rows locked to claim {len(due)} among {blocked} blocked jobs"


@pytest.mark.postgres
def test_the_orm_claim_locks_with_skip_locked_and_the_fast_path_is_one_statement(claim_path):
    enqueue(jobs.noop)
    with CaptureQueriesContext(connection) as queries:
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=5, token="w#1", lease=30))
    assert job.attempts == 1
    statements = [q["sql"] for q in queries.captured_queries]
    if claim_path == "orm":
        locking = [s for s in statements if s.endswith("FOR UPDATE SKIP LOCKED")]
        # The expired leases, the due jobs, then the rows claimed (locked already).
        assert len(locking) == 3
        assert not any(s.startswith("WITH beat AS") for s in statements)
    else:
        assert len(statements) == 1 and statements[0].startswith("WITH beat AS")


def test_taking_over_an_expired_lease_records_the_entry_attempts_builds():
    """The claim's SQL (and the ORM claim) build the lease-expired entry attempts.py builds."""
    past = timezone.now() - dt.timedelta(minutes=5)
    JobFactory(locked_by="host:9:cd#4", lease_expires_at=past, attempts=2)
    [job] = JobStore().claim(
        ClaimRequest(queues=["default"], limit=1, token="host:1:ab#1", lease=30)
    )
    [entry] = job.errors
    expected = lease_expired_entry(2, "host:9:cd#4", timezone.now())
    assert entry.keys() == expected.keys()
    assert {k: type(v) for k, v in entry.items()} == {k: type(v) for k, v in expected.items()}
    assert {k: v for k, v in entry.items() if k != "at"} == {
        k: v for k, v in expected.items() if k != "at"
    }
    assert abs(dt.datetime.fromisoformat(entry["at"]) - timezone.now()) < dt.timedelta(minutes=1)


@pytest.mark.postgres
@pytest.mark.parametrize("token", ["", "w", "w#", "#1", "host:1:ab#12", "a#b#c", "é#ü"])
def test_split_part_is_the_sql_twin_of_worker_of(token, claim_path):
    with connection.cursor() as cursor:
        cursor.execute("SELECT split_part(%s, '#', 1)", [token])
        assert cursor.fetchone()[0] == worker_of(token)
    assert worker_of(lease_token("host:1:ab", 12)) == "host:1:ab"
