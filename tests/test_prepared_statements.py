"""The worker's statements run prepared on PostgreSQL, and survive a pooler that loses them.

Django turns psycopg's prepared statements off (prepare_threshold None); store/sql.py turns
them on for its own statements run in autocommit (the worker's), and nowhere else.
"""

from __future__ import annotations

import json
import logging
import signal

import pytest
from django.db import connection, transaction

from django_jobs import enqueue_many
from django_jobs.models import CompletionMarker, Job
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore, pgrun
from tests.conftest import PGBOUNCER, wait_for
from tests.testapp.jobs import record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def prepared() -> list[str]:
    """The statements prepared on this test's connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def claim(limit=1):
    request = ClaimRequest(queues=["default"], limit=limit, token="test#1", lease=30)
    return JobStore().claim(request)


@pytest.fixture
def fresh_connection():
    """A new connection (none of an earlier test's statements prepared), the flag reset."""
    connection.close()
    pgrun._UNPREPARED.clear()
    yield
    pgrun._UNPREPARED.clear()
    connection.close()


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer's run turns PREPARED_STATEMENTS off")
def test_the_claim_is_prepared_once_and_django_s_queries_are_not(fresh_connection):
    enqueue_many(record, [{"label": str(n)} for n in range(3)])
    assert not [s for s in prepared() if "claimed" in s]
    for _ in range(3):
        assert len(claim()) == 1
    claims = [s for s in prepared() if "claimed" in s]
    assert len(claims) == 1  # one statement, prepared at its first run, used three times
    assert not [s for s in prepared() if "django_jobs_job" in s and "claimed" not in s]
    for _ in range(10):  # Django's own queries stay unprepared however often they run
        Job.objects.filter(queue="default").count()
    assert len(prepared()) == 1


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer's run turns PREPARED_STATEMENTS off")
def test_statements_inside_a_transaction_are_not_prepared(fresh_connection):
    enqueue_many(record, [{"label": "a"}])
    with transaction.atomic():
        assert len(claim()) == 1
        assert not prepared()


def test_nothing_is_prepared_when_the_setting_is_off(fresh_connection, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "PREPARED_STATEMENTS": False}
    enqueue_many(record, [{"label": "a"}])
    assert len(claim()) == 1
    assert not prepared()


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer's run turns PREPARED_STATEMENTS off")
def test_a_lost_prepared_statement_is_run_again_unprepared(fresh_connection, caplog):
    """What a transaction pooler does: the next statement lands on a session without it."""
    enqueue_many(record, [{"label": str(n)} for n in range(2)])
    assert len(claim()) == 1
    with connection.cursor() as cursor:  # by name: psycopg notices a DEALLOCATE ALL
        cursor.execute("SELECT name FROM pg_prepared_statements")
        (name,) = cursor.fetchone()
        cursor.execute(f"DEALLOCATE {name}")
    with caplog.at_level(logging.WARNING, logger="django_jobs.worker"):
        assert len(claim()) == 1  # not an error: the same claim, unprepared
    assert "lost a prepared statement" in caplog.text
    assert "PREPARED_STATEMENTS'] = False" in caplog.text
    assert pgrun._UNPREPARED == ["default"]
    enqueue_many(record, [{"label": "c"}])
    assert len(claim()) == 1
    assert not prepared()  # nothing prepared again in this process


@pytest.mark.slow
@pytest.mark.pgbouncer  # there too: PgBouncer 1.18 in transaction pooling keeps no statement
def test_a_worker_told_to_prepare_behind_any_pooler_runs_its_jobs(worker_process):
    """PREPARED_STATEMENTS on where the run may go through PgBouncer (dev.py's pgbouncer run)."""
    results = enqueue_many(record, [{"label": str(n)} for n in range(200)])
    env = {"JOBS_TEST_SETTINGS": json.dumps({"PREPARED_STATEMENTS": True})}
    worker = worker_process("--concurrency", "2", "--poll-interval", "0.1", extra_env=env)
    wait_for(lambda: CompletionMarker.objects.count() == len(results), timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    assert not Job.objects.exists()
