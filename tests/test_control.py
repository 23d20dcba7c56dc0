"""Control: pausing and resuming queues, cancelling waiting and running jobs."""

from __future__ import annotations

import signal
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_jobs import control, enqueue
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, QueueState
from tests.conftest import wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

POLL = 0.2  # tests/settings.py's POLL_INTERVAL


# ---- pause and resume ------------------------------------------------------------------------


def test_paused_queue_is_not_claimed_and_resume_lets_it_run(run_worker, capsys):
    paused_job = enqueue(jobs.record, {"label": "default-queue"})
    other = enqueue(jobs.other_queue, {})
    call_command("jobs", "pause", "default", "--reason", "incident 42")
    assert "paused 1 queue(s)" in capsys.readouterr().out
    state = QueueState.objects.get(name="default")
    assert (state.paused, state.reason, state.paused_by) == (True, "incident 42", "manage.py jobs")
    worker = run_worker(queues=["default", "emails"])
    assert CompletionMarker.objects.filter(job_id=other.id).exists()  # other queues go on
    assert Job.objects.filter(id=paused_job.id, attempts=0, locked_by__isnull=True).exists()
    assert worker.stats.claimed == 1
    call_command("jobs", "resume", "default")
    assert "resumed 1 queue(s)" in capsys.readouterr().out
    run_worker(queues=["default", "emails"])
    assert CompletionMarker.objects.filter(job_id=paused_job.id).exists()


def test_pause_refuses_bad_queue_names():
    with pytest.raises(CommandError, match="'bad queue' is not a valid queue name"):
        call_command("jobs", "pause", "bad queue")
    assert not QueueState.objects.exists()


@pytest.mark.slow
def test_a_running_worker_honours_a_pause_within_one_poll_and_finishes_running_jobs(worker_process):
    worker = worker_process("--concurrency", "2")
    enqueue(jobs.sleep, {"seconds": 1.0, "label": "in-flight"})
    wait_for(
        lambda: Audit.objects.filter(label="start-in-flight").exists(),
        message="the first job to start",
    )
    control.pause(["default"])
    time.sleep(POLL + 0.3)  # one poll interval, and a margin for a busy machine
    late = enqueue(
        jobs.record, {"label": "late"}
    )  # NOTIFY wakes the worker: it must still not claim
    wait_for(
        lambda: Audit.objects.filter(label="end-in-flight").exists(),
        message="the running job to finish",
    )
    time.sleep(4 * POLL)
    assert Job.objects.filter(id=late.id, attempts=0, locked_by__isnull=True).exists()
    control.resume(["default"])
    wait_for(
        lambda: CompletionMarker.objects.filter(job_id=late.id).exists(),
        message="the job after resume",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


# ---- cancel --------------------------------------------------------------------------------------


def test_cancelling_a_waiting_job_dead_letters_it_at_once(capsys):
    waiting = enqueue(jobs.record, {"label": "never"})
    later = enqueue(jobs.record, {"label": "later"}, delay=600)
    call_command("jobs", "cancel", str(waiting.id), str(later.id))
    assert "cancelled 2 waiting job(s)" in capsys.readouterr().out
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
