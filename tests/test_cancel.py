"""Cancelling jobs: waiting ones become dead letters at once, running ones stop at a heartbeat."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobs import control, enqueue
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.store import JobStore
from tests.conftest import wait_for
from tests.factories import JobFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


# ---- waiting and scheduled jobs ------------------------------------------------------------------


def test_cancel_moves_waiting_and_scheduled_jobs_to_the_dead_letters():
    waiting = JobFactory(
        name="tests.record",
        payload='{"label": "x"}',
        key="c-1",
        attempts=1,
        errors=[{"attempt": 1, "type": "builtins.RuntimeError", "message": "boom"}],
    )
    scheduled = JobFactory(run_at=timezone.now() + timedelta(hours=1))
    running = JobFactory(leased=True)

    report = JobStore().cancel(Job.objects.all(), by="ada")

    assert sorted(report.cancelled) == sorted([waiting.id, scheduled.id])
    assert report.running == [running.id]
    assert str(report) == "2 cancelled, 1 running (not cancelled)"
    assert list(Job.objects.values_list("id", flat=True)) == [running.id]
    letter = DeadLetter.objects.get(id=waiting.id)
    assert letter.reason == DeadReason.CANCELLED
    assert (letter.name, letter.payload, letter.key, letter.attempts) == (
        "tests.record",
        '{"label": "x"}',
        "c-1",
        1,
    )
    assert letter.error == "django_jobs.Cancelled: cancelled by ada"
    assert [e["type"] for e in letter.errors] == ["builtins.RuntimeError", "django_jobs.Cancelled"]


def test_a_cancelled_job_can_be_replayed(run_worker):
    job = JobFactory(name="tests.record", payload='{"label": "back"}', key="c-2")
    JobStore().cancel(Job.objects.filter(pk=job.pk))
    assert not Job.objects.exists()

    report = control.replay(DeadLetter.objects.filter(pk=job.pk))
    run_worker()

    assert len(report.replayed) == 1
    assert Audit.objects.get().label == "back"
    assert CompletionMarker.objects.filter(key="c-2").exists()


def test_cancelling_a_waiting_job_dead_letters_it_at_once(capsys):
    waiting = enqueue(jobs.record, {"label": "never"})
    later = enqueue(jobs.record, {"label": "later"}, delay=600)
    call_command("jobs", "cancel", str(waiting.id), str(later.id))
    assert "cancelled 2 job(s) (1 waiting, 1 scheduled); " in capsys.readouterr().out
    assert not Job.objects.exists()
    letters = DeadLetter.objects.order_by("id")
    assert [(d.id, d.reason, d.attempts) for d in letters] == [
        (waiting.id, DeadReason.CANCELLED, 0),
        (later.id, DeadReason.CANCELLED, 0),
    ]
    assert letters[0].errors[-1]["type"] == "django_jobs.Cancelled"
    assert "manage.py jobs" in letters[0].error


def test_cancel_command_refuses_bad_ids():
    with pytest.raises(CommandError, match="'not-a-uuid' is not a job id"):
        call_command("jobs", "cancel", "not-a-uuid")


# ---- running jobs --------------------------------------------------------------------------------


@pytest.mark.slow
def test_cancelling_a_running_job_stops_it_at_the_next_heartbeat(worker_process):
    result = enqueue(jobs.until_cancelled, {"seconds": 60, "label": "c"})
    worker = worker_process("--concurrency", "1", "--lease", "1.5")  # heartbeat every 0.5 s
    wait_for(lambda: Audit.objects.filter(label="start-c").exists(), message="the job to start")
    outcome = control.cancel([result.id], by="alice")
    assert (outcome.cancelled, outcome.requested) == (0, 1)
    asked = time.monotonic()
    letter = wait_for(
        lambda: DeadLetter.objects.filter(id=result.id).first(),
        timeout=10,
        message="the dead letter",
    )
    assert time.monotonic() - asked < 3  # a heartbeat (0.5 s) and a little
    assert (letter.reason, letter.attempts) == (DeadReason.CANCELLED, 1)
    assert "stopped: cancelled" in letter.error
    assert not Job.objects.exists()
    assert Audit.objects.filter(label="start-c").count() == 1  # not retried
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


@pytest.mark.slow
def test_a_running_job_that_ignores_cancellation_completes(worker_process):
    result = enqueue(
        jobs.sleep, {"seconds": 1.5, "label": "stubborn"}
    )  # never looks at ctx.cancelled
    worker = worker_process("--concurrency", "1", "--lease", "1.5")
    wait_for(
        lambda: Audit.objects.filter(label="start-stubborn").exists(), message="the job to start"
    )
    control.cancel([result.id])
    wait_for(
        lambda: CompletionMarker.objects.filter(job_id=result.id).exists(),
        message="the job to complete",
    )
    assert not DeadLetter.objects.exists()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
