"""The heartbeat of real `runjobs` processes: a lease is reported lost only when it was."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from django_jobs import enqueue
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.rows import ClaimRequest, Leases
from django_jobs.store import JobStore
from tests.conftest import ENGINE, wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit

LEASE_LOST = "lease lost (another worker took it over)"
PAST = "2000-01-01T00:00:00Z"


def _enqueue_many(handler, payloads):
    with transaction.atomic():
        for payload in payloads:
            enqueue(handler, payload)


def _claim(token):
    return JobStore().claim(ClaimRequest(queues=["default"], limit=10, token=token, lease=30))


def _take_over(job_id, token="thief:1:aa#1"):
    """Expire the job's lease and lease it to another token, as a second worker's claim does."""
    with transaction.atomic():
        Job.objects.filter(id=job_id).update(lease_expires_at=PAST)
        [taken] = _claim(token)
    assert taken.id == job_id
    return taken


@pytest.mark.django_db(transaction=True)
class TestExtendLeases:
    def test_held_jobs_are_extended_and_say_whether_an_operator_asked_to_cancel(self):
        first = enqueue(jobs.record, {"label": "a"}).id
        second = enqueue(jobs.record, {"label": "b"}).id
        claimed = _claim("w:1:aa#1")
        JobStore().request_cancel(Job.objects.filter(id=second))
        assert JobStore().extend_leases(claimed, 60) == Leases(
            {first: False, second: True}, frozenset()
        )

    def test_a_job_leased_to_another_token_is_lost(self):
        job_id = enqueue(jobs.record, {"label": "a"}).id
        [mine] = _claim("w:1:aa#1")
        _take_over(job_id)
        assert JobStore().extend_leases([mine], 60) == Leases({}, frozenset({job_id}))
        # ... and the extend left the new holder's lease alone.
        assert Job.objects.get(id=job_id).locked_by == "thief:1:aa#1"

    def test_a_job_its_own_atomic_attempt_settled_is_neither_held_nor_lost(self):
        job_id = enqueue(jobs.record_atomic, {"label": "a"}).id
        [mine] = _claim("w:1:aa#1")
        with transaction.atomic():
            assert JobStore().complete_atomically(mine, None)
        assert CompletionMarker.objects.get().job_id == job_id
        assert JobStore().extend_leases([mine], 60) == Leases({}, frozenset())

    def test_a_job_another_attempt_settled_is_lost(self):
        job_id = enqueue(jobs.record_atomic, {"label": "a"}).id
        [mine] = _claim("w:1:aa#1")
        theirs = _take_over(job_id)
        with transaction.atomic():
            assert JobStore().complete_atomically(theirs, None)
        assert CompletionMarker.objects.get().worker_id == "thief:1:aa"
        assert JobStore().extend_leases([mine], 60) == Leases({}, frozenset({job_id}))

    def test_a_job_gone_without_a_marker_is_lost(self):
        job_id = enqueue(jobs.record, {"label": "a"}).id
        [mine] = _claim("w:1:aa#1")
        Job.objects.filter(id=job_id).delete()
        assert JobStore().extend_leases([mine], 60) == Leases({}, frozenset({job_id}))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.mariadb
def test_a_single_worker_never_reports_the_leases_of_its_own_atomic_jobs_lost(worker_process):
    # The atomic handler's transaction deletes the row and commits before the
    # dispatcher hears of it; a heartbeat in between used to find the row gone and
    # warn (5 per 3,000 jobs on PostgreSQL, 14 per 2,000 on MariaDB), cancelling the run.
    total = 3_000 if ENGINE != "sqlite" else 1_000
    _enqueue_many(jobs.record_atomic, ({"label": f"job-{i}"} for i in range(total)))
    worker = worker_process("--burst", "--concurrency", "4", "--heartbeat", "0.001")
    assert worker.wait(timeout=600) == 0, worker.output()[-3000:]
    output = worker.output()
    assert output.count(LEASE_LOST) == 0, [line for line in output.splitlines() if "lost" in line]
    assert "taken over" not in output
    assert CompletionMarker.objects.count() == total
    assert Audit.objects.values("job_id").distinct().count() == Audit.objects.count() == total
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.mariadb
def test_a_lease_another_worker_took_over_is_reported_and_cancels_the_run(worker_process):
    job_id = enqueue(jobs.until_cancelled, {"seconds": 60, "label": "held"}).id
    worker = worker_process("--concurrency", "1", "--lease", "5", "--heartbeat", "0.1")
    wait_for(lambda: Audit.objects.filter(label="start-held").exists(), message="the job to start")
    # Another worker takes the job over: its lease is past (the first worker hung, say)
    # and a claim under another token leases it, in one transaction so that no
    # heartbeat of the first worker can extend the lease in between.
    assert _take_over(job_id).attempts == 2
    took_over = time.monotonic()
    # ctx.cancelled is set: the handler stops long before its 60 s, and its late
    # result (a retry) is fenced out by the new token.
    wait_for(
        lambda: "its late result is dropped" in worker.output(),
        timeout=20,
        message="the first worker to drop its late result",
    )
    assert time.monotonic() - took_over < 20
    output = worker.output()
    assert output.count(LEASE_LOST) == 1, output[-3000:]
    assert Job.objects.get(id=job_id).locked_by == "thief:1:aa#1"  # the thief's, untouched
    assert not Audit.objects.filter(label="end-held").exists()
    worker.signal(15)
    assert worker.wait(timeout=20) == 0
