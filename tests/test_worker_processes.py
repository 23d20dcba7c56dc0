"""Real `runjobs` processes, real signals, the real database (PostgreSQL, SQLite, MariaDB)."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from django.db import connection, transaction
from django.test import Client

from django_jobs import enqueue
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from tests.conftest import ENGINE, wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit, Order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _enqueue_many(handler, payloads):
    with transaction.atomic():
        for payload in payloads:
            enqueue(handler, payload)


def _audit_count(prefix):
    return Audit.objects.filter(label__startswith=prefix).count()


@pytest.mark.pgbouncer
@pytest.mark.postgres
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_four_processes_share_ten_thousand_atomic_jobs_exactly_once(worker_process, claim):
    total = 10_000
    _enqueue_many(jobs.record_atomic, ({"label": f"job-{i}"} for i in range(total)))
    started = time.monotonic()
    env = {"JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim})}
    workers = [worker_process("--burst", "--concurrency", "4", extra_env=env) for _ in range(4)]
    codes = [w.wait(timeout=240) for w in workers]
    elapsed = time.monotonic() - started
    assert codes == [0, 0, 0, 0], [w.output()[-2000:] for w in workers]
    assert Audit.objects.count() == total
    assert Audit.objects.values("job_id").distinct().count() == total
    assert CompletionMarker.objects.count() == total
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    print(
        f"4 workers x {total} atomic jobs, claim {claim}: "
        f"{elapsed:.1f}s ({total / elapsed:.0f} jobs/s)"
    )


@pytest.mark.mariadb
@pytest.mark.skipif(ENGINE != "mariadb", reason="MariaDB's run only (see the test above)")
def test_three_processes_share_five_thousand_atomic_jobs_exactly_once_on_mariadb(worker_process):
    total = 5_000
    _enqueue_many(jobs.record_atomic, ({"label": f"job-{i}"} for i in range(total)))
    started = time.monotonic()
    workers = [worker_process("--burst", "--concurrency", "4") for _ in range(3)]
    codes = [w.wait(timeout=600) for w in workers]
    elapsed = time.monotonic() - started
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    effects = Audit.objects.count()
    distinct = Audit.objects.values("job_id").distinct().count()
    markers = CompletionMarker.objects.count()
    print(
        f"3 workers x {total} atomic jobs on MariaDB: {elapsed:.1f}s ({total / elapsed:.0f} jobs/s)"
        f", lost {total - distinct}, doubled {effects - distinct}, markers {markers}"
    )
    assert (effects, distinct, markers) == (total, total, total)
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0


@pytest.mark.pgbouncer
@pytest.mark.mariadb
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_sigkill_loses_nothing_and_counts_the_killed_attempt(worker_process, claim):
    _enqueue_many(jobs.sleep, ({"seconds": 1.0, "label": str(i)} for i in range(6)))
    env = {"JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim})}
    victim = worker_process("--concurrency", "3", "--lease", "1.5", extra_env=env)
    wait_for(lambda: _audit_count("start") >= 3, message="the victim to start 3 jobs")
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    held = list(Job.objects.filter(locked_by__isnull=False).values_list("id", flat=True))
    assert held, "the killed worker held claimed jobs"
    rescuer = worker_process("--concurrency", "3", "--lease", "1.5", extra_env=env)
    wait_for(
        lambda: CompletionMarker.objects.count() == 6, timeout=30, message="all 6 jobs to complete"
    )
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    # Each job the victim held ran again, its lost attempt counted and noted.
    for marker in CompletionMarker.objects.filter(job_id__in=held):
        assert marker.attempts == 2


def test_sigterm_finishes_running_jobs_and_claims_nothing_more(worker_process):
    _enqueue_many(jobs.sleep, ({"seconds": 1.0, "label": f"first-{i}"} for i in range(2)))
    worker = worker_process("--concurrency", "2", "--grace", "10")
    wait_for(lambda: _audit_count("start-first") == 2, message="both jobs to start")
    _enqueue_many(jobs.record, ({"label": f"late-{i}"} for i in range(5)))
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert _audit_count("end-first") == 2  # the in-flight jobs finished
    assert CompletionMarker.objects.count() == 2
    assert _audit_count("late") == 0  # nothing was claimed after the signal
    assert Job.objects.count() == 5
    assert set(Job.objects.values_list("attempts", "locked_by")) == {(0, None)}


def test_sigterm_releases_jobs_that_outlive_the_grace_without_consuming_an_attempt(worker_process):
    _enqueue_many(jobs.sleep, ({"seconds": 30, "label": f"long-{i}"} for i in range(2)))
    worker = worker_process("--concurrency", "2", "--grace", "0.5")
    wait_for(lambda: _audit_count("start-long") == 2, message="both jobs to start")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert time.monotonic() - started < 10
    assert CompletionMarker.objects.count() == 0
    assert set(Job.objects.values_list("attempts", "locked_by", "lease_expires_at")) == {
        (0, None, None)
    }
    # The warning names each job and its handler, and how long it had run.
    out = worker.output()
    assert "2 job(s) still running after the grace period (0.5s) were released" in out, out
    for job_id in Job.objects.values_list("id", flat=True):
        assert re.search(rf"job {job_id} \(tests\.sleep, running \d+s\)", out), out


def test_second_signal_exits_at_once(worker_process):
    _enqueue_many(jobs.sleep, ({"seconds": 30, "label": "stuck"},))
    worker = worker_process("--concurrency", "1", "--grace", "60")
    wait_for(lambda: _audit_count("start-stuck") == 1, message="the job to start")
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    assert worker.proc.poll() is None  # still within its grace period
    worker.signal(signal.SIGINT)
    assert worker.wait(timeout=5) == 128 + signal.SIGINT
    # The lease is left to expire: rescue takes over from there.
    assert Job.objects.get().locked_by is not None


@pytest.mark.pgbouncer
def test_a_job_that_kills_its_worker_every_time_ends_in_the_dead_letters(worker_process):
    result = enqueue(jobs.crash)  # os._exit(13), max_attempts=2
    codes = []
    for _ in range(6):
        if DeadLetter.objects.exists():
            break
        proc = worker_process("--burst", "--lease", "0.5")
        codes.append(proc.wait(timeout=30))
        time.sleep(0.6)  # let the lease of the killed attempt expire
    assert 13 in codes
    letter = DeadLetter.objects.get(id=result.id)
    assert letter.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert letter.attempts == 2
    assert codes.count(13) == 2  # it ran exactly max_attempts times
    assert Job.objects.count() == 0


@pytest.mark.pgbouncer
def test_view_transaction_decides_whether_the_worker_sees_the_job(worker_process):
    client = Client(raise_request_exception=False)
    assert client.post("/orders/", {"item": "kept"}).status_code == 200
    assert client.post("/orders/", {"item": "lost", "fail": "1"}).status_code == 500
    assert Order.objects.count() == 1
    worker = worker_process("--burst")
    assert worker.wait() == 0
    order = Order.objects.get()
    assert list(Audit.objects.values_list("label", flat=True)) == [f"order-{order.pk}"]


@pytest.mark.postgres
def test_worker_survives_its_connections_being_killed(worker_process):
    _enqueue_many(jobs.record, ({"label": f"j{i}"} for i in range(300)))
    _enqueue_many(jobs.sleep, ({"seconds": 0.5, "label": f"s{i}"} for i in range(20)))
    worker = worker_process("--concurrency", "4", "--lease", "3")
    pid = worker.pid
    wait_for(lambda: CompletionMarker.objects.count() > 50, message="some progress")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        killed = len(cursor.fetchall())
    assert killed >= 1
    wait_for(
        lambda: CompletionMarker.objects.count() == 320, timeout=60, message="every job to complete"
    )
    assert worker.proc.poll() is None and worker.pid == pid  # same process, still serving
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert Job.objects.count() == 0
    assert "database error" in worker.output() or "lost its connection" in worker.output()
