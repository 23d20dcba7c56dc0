"""Chunk handlers run by real `runjobs` processes sharing one database, one of them SIGKILLed.

PostgreSQL (both claim paths), SQLite and MariaDB (the ORM claim).
"""

from __future__ import annotations

import json
import signal
import socket

import pytest
from django.db.models import Count

from django_jobs import enqueue_many
from django_jobs.models import CompletionMarker, DeadLetter, Job
from tests.conftest import POSTGRES, wait_for
from tests.testapp import chunk_jobs
from tests.testapp.models import Audit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOTAL = 300
CLAIMS = ["auto", "orm"] if POSTGRES else ["auto"]  # elsewhere "auto" is the ORM claim
SLEEP = 0.15  # per chunk: 30 chunks over 6 threads take about a second, long enough to kill in


@pytest.fixture
def handlers():
    registered = chunk_jobs.register()
    yield registered
    chunk_jobs.unregister_all()


def _run_with_a_kill(worker_process, handler, claim):
    """Run TOTAL jobs of handler on 3 workers; SIGKILL one mid-run and start another."""
    results = enqueue_many(handler, [{"n": n, "sleep": SLEEP} for n in range(TOTAL)])
    ids = {r.id for r in results}
    env = {"JOBS_TEST_CHUNKS": "1", "JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim})}
    args = ("--concurrency", "2", "--lease", "1.5", "--poll-interval", "0.1")
    workers = [worker_process(*args, extra_env=env) for _ in range(3)]
    victim = workers[0]
    # Mid-run: some chunks done, and the victim holding jobs (buffered or running).
    wait_for(
        lambda: (
            CompletionMarker.objects.count() >= TOTAL // 5
            and Job.objects.filter(locked_by__startswith=_prefix(victim)).exists()
        ),
        timeout=15,
        message="the victim to hold jobs mid-run",
    )
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    held = Job.objects.filter(locked_by__isnull=False).count()
    done_at_kill = CompletionMarker.objects.count()
    assert done_at_kill < TOTAL, "the run finished before the kill"
    workers.append(worker_process(*args, extra_env=env))  # its restart
    workers[-1].wait_serving()  # else the others may finish first and SIGTERM it mid-start
    wait_for(
        lambda: CompletionMarker.objects.count() == TOTAL and not Job.objects.exists(),
        timeout=30,
        message=f"all {TOTAL} jobs to complete",
    )
    for worker in workers[1:]:
        worker.signal(signal.SIGTERM)
    for worker in workers[1:]:
        assert worker.wait(timeout=20) == 0, worker.output()[-3000:]
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == ids
    assert not Job.objects.exists()
    assert not DeadLetter.objects.exists()
    # The victim's claimed jobs were taken over after their leases expired, the killed
    # attempt counted (at the claim) and noted.
    assert CompletionMarker.objects.filter(attempts=2).exists()
    return ids, held, done_at_kill


def _prefix(worker):
    """The start of the lock tokens of worker's claims (its worker id: host:pid:...)."""
    return f"{socket.gethostname()}:{worker.pid}:"


def _audit_per_job():
    return dict(Audit.objects.values_list("job_id").annotate(n=Count("id")))


@pytest.mark.mariadb
@pytest.mark.parametrize("claim", CLAIMS)
def test_atomic_chunks_run_exactly_once_across_processes_one_killed(
    handlers, worker_process, claim
):
    ids, held, done = _run_with_a_kill(worker_process, handlers["atomic"], claim)
    per_job = _audit_per_job()
    assert set(per_job) == ids  # every payload's effect ...
    assert set(per_job.values()) == {1}  # ... exactly once, the killed chunks rolled back
    assert Audit.objects.count() == TOTAL
    labels = set(Audit.objects.values_list("label", flat=True))
    assert labels == {f"n-{n}" for n in range(TOTAL)}
    print(f"atomic, claim {claim}: killed holding {held} job(s) at {done}/{TOTAL} done")


@pytest.mark.parametrize("claim", CLAIMS)
def test_plain_chunks_lose_no_job_across_processes_one_killed(handlers, worker_process, claim):
    ids, held, done = _run_with_a_kill(worker_process, handlers["plain"], claim)
    per_job = _audit_per_job()
    assert set(per_job) == ids  # at least once: no job lost
    doubled = sum(count - 1 for count in per_job.values())
    # Only a chunk the victim was running when killed may have run twice.
    assert doubled <= held, (doubled, held)
    print(
        f"plain, claim {claim}: killed holding {held} job(s) at {done}/{TOTAL} done; "
        f"{doubled} payload(s) ran twice"
    )
