"""Workers keep the hot table vacuumed when dead rows pile up (autovacuum may be off)."""

import pytest
from django.db import connection

from django_jobs import enqueue_many
from django_jobs.models import CompletionMarker
from django_jobs.worker import Worker, upkeep
from tests.testapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _vacuums() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'django_jobs_job'::regclass"
        )
        return cursor.fetchone()[0]


def test_a_busy_worker_vacuums_the_jobs_table_when_dead_rows_pile_up(monkeypatch):
    monkeypatch.setattr(upkeep, "VACUUM_CHECK_JOBS", 1000)
    monkeypatch.setattr(upkeep, "VACUUM_MIN_DEAD", 500)
    before = _vacuums()
    enqueue_many(jobs.noop, [{"i": i} for i in range(3000)])
    worker = Worker(burst=True, concurrency=2)
    worker.run()
    assert CompletionMarker.objects.count() == 3000
    assert worker._ops.counters["vacuums"] >= 1
    assert _vacuums() > before


def test_an_idle_worker_does_not_look(monkeypatch):
    looked = []
    monkeypatch.setattr(upkeep.sql, "dead_rows", lambda *a: looked.append(a) or 0)
    Worker(burst=True, concurrency=1).run()
    assert looked == []
