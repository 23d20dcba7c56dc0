"""Pausing and resuming queues: paused queues are not claimed, running jobs finish."""

from __future__ import annotations

import signal
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_jobs import control, enqueue
from django_jobs.models import CompletionMarker, Job, QueueState
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


def test_pause_refuses_a_queue_no_handler_declares_and_no_job_uses(capsys):
    with pytest.raises(CommandError) as caught:
        call_command("jobs", "pause", "emials")
    message = str(caught.value)
    assert "no handler declares queue(s) 'emials'" in message
    assert "did you mean 'emails' for 'emials'?" in message
    assert "--undeclared" in message
    assert not QueueState.objects.exists()  # nothing written


def test_pause_of_an_undeclared_queue_with_jobs_or_with_undeclared_is_allowed(capsys):
    enqueue(jobs.record, {}, queue="adhoc")  # a queue no handler declares, with a job
    call_command("jobs", "pause", "adhoc")
    call_command("jobs", "pause", "later", "--undeclared")
    assert set(QueueState.objects.filter(paused=True).values_list("name", flat=True)) == {
        "adhoc",
        "later",
    }


def test_resume_forgets_an_undeclared_queue_without_jobs(capsys):
    call_command("jobs", "pause", "later", "--undeclared")
    enqueue(jobs.record, {}, queue="adhoc")
    call_command("jobs", "pause", "adhoc", "default")
    call_command("jobs", "resume", "later", "adhoc", "default")
    assert "resumed 3 queue(s)" in capsys.readouterr().out
    # "later" existed only for its pause; "adhoc" holds a job; "default" is declared.
    assert set(QueueState.objects.values_list("name", flat=True)) == {"adhoc", "default"}
    call_command("jobs", "status")
    assert "later" not in capsys.readouterr().out


def test_a_burst_worker_says_which_of_its_queues_are_paused(worker_process):
    job = enqueue(jobs.record, {})
    control.pause(["default"], by="ops", reason="incident 7")
    proc = worker_process("--burst", "--queue", "default")
    assert proc.wait() == 0
    out = proc.output()
    assert (
        "queue 'default' is paused by ops (incident 7): no worker claims its jobs until "
        "`python manage.py jobs resume default`" in out
    ), out
    assert Job.objects.filter(id=job.id, attempts=0).exists()


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
