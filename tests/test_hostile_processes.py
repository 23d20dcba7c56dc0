"""Hostile handlers against real `runjobs` processes: exit codes, signals, log sizes."""

from __future__ import annotations

import signal
import time

import pytest

from django_jobs import enqueue
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from tests.conftest import wait_for
from tests.testapp import hostile, jobs
from tests.testapp.models import Audit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_burst_worker_of_one_thread_facing_keyboard_interrupt_exits_0(worker_process):
    job = enqueue(hostile.hostile, {"raise": "KeyboardInterrupt", "message": "^C in a handler"})
    ordinary = enqueue(jobs.record, {"label": "after"})
    worker = worker_process("--burst", "--concurrency", "1", "--lease", "3")
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 2)
    assert [e["type"] for e in letter.errors] == ["builtins.KeyboardInterrupt"] * 2
    assert CompletionMarker.objects.filter(job_id=ordinary.id).exists()
    assert Audit.objects.filter(label="after").count() == 1
    assert Job.objects.count() == 0


def test_sigterm_does_not_give_back_the_attempt_of_a_job_whose_handler_raised(worker_process):
    """The release at shutdown is for jobs a thread still runs; this one already failed."""
    job = enqueue(hostile.hostile_retry_later, {"raise": "KeyboardInterrupt"})
    worker = worker_process("--concurrency", "1", "--lease", "2", "--grace", "2")
    wait_for(
        lambda: Job.objects.filter(id=job.id, locked_by__isnull=True, attempts=1).exists(),
        timeout=30,
        message="the failed attempt to be recorded",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    row = Job.objects.get(id=job.id)
    assert (row.attempts, row.locked_by) == (1, None)  # the attempt stays counted
    assert [e["type"] for e in row.errors] == ["builtins.KeyboardInterrupt"]
    assert "were released" not in worker.output()


def test_ten_megabyte_messages_make_small_logs_and_rows(worker_process):
    message = {"text": "x", "repeat": 10_000_000}
    payload = {"raise": "ValueError", "message": message}
    ids = [enqueue(hostile.hostile, payload).id for _ in range(3)]
    started = time.monotonic()
    worker = worker_process("--burst", "--concurrency", "1", "-v", "3")
    assert worker.wait(timeout=60) == 0
    elapsed = time.monotonic() - started
    log = worker.output()
    assert len(log) < 500_000, f"{len(log)} characters of log"
    letters = DeadLetter.objects.filter(id__in=ids)
    assert letters.count() == 3
    assert all(len(letter.error) < 2_100 and len(letter.traceback) < 16_100 for letter in letters)
    print(f"3 x 10 MB messages: log {len(log):,} chars, {elapsed:.1f}s")


def test_a_handler_flooding_stdout_does_not_stop_the_worker(worker_process):
    job = enqueue(hostile.hostile, {"print": 2_000_000, "return": {"json": "printed"}})
    worker = worker_process("--burst", "--concurrency", "1")
    assert worker.wait(timeout=30) == 0
    assert CompletionMarker.objects.get(job_id=job.id).result == "printed"
