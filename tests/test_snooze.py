"""Snooze: a handler asks to run again later, without consuming an attempt."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs import Snooze, enqueue
from django_jobs.models import CompletionMarker, DeadLetter, Job
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


def test_snooze_runs_again_without_consuming_an_attempt(run_worker):
    result = enqueue(jobs.snoozer, {"times": 3})  # max_attempts=1: a counted attempt would kill it
    worker = run_worker()
    assert worker.stats.snoozed == 3
    marker = CompletionMarker.objects.get(job_id=result.id)
    assert (marker.attempts, marker.result) == (1, 3)
    assert list(Audit.objects.order_by("id").values_list("label", "attempt")) == [
        ("snoozer-0", 1),
        ("snoozer-1", 1),
        ("snoozer-2", 1),
        ("snoozer-3", 1),
    ]
    assert not DeadLetter.objects.exists()


def test_snooze_waits_and_leaves_no_error(run_worker):
    enqueue(jobs.snoozer, {"times": 1, "seconds": 120})
    run_worker()
    job = Job.objects.get()
    assert (job.attempts, job.locked_by, job.errors) == (0, None, [])
    assert job.run_at > timezone.now() + timedelta(seconds=100)


def test_snooze_rolls_back_an_atomic_handlers_effects(run_worker):
    enqueue(jobs.snoozer_atomic, {})
    worker = run_worker(max_jobs=1)  # it snoozes for 0 s: burst alone would run it forever
    assert worker.stats.snoozed == 1
    assert not Audit.objects.filter(label="atomic-effect").exists()
    job = Job.objects.get()
    assert job.attempts == 0
    Audit.objects.create(label="snooze-done")
    run_worker()
    assert Audit.objects.filter(label="atomic-effect").count() == 1
    assert CompletionMarker.objects.get().attempts == 1


@pytest.mark.parametrize(
    ("seconds", "error"), [(-1, ValueError), (float("nan"), ValueError), ("soon", TypeError)]
)
def test_bad_snooze_is_a_clear_error(seconds, error):
    with pytest.raises(error, match="Snooze"):
        Snooze(seconds)
