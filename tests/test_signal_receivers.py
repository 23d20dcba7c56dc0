"""A receiver of a django-jobs signal that raises is logged; nothing else fails.

Monitoring code connected to the signals (metrics, audit logs) must never fail a
view's commit, a job or the worker: each signal goes through signals.send, which
calls every receiver and logs the one that raised, with its traceback.
"""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from django_jobs import enqueue, enqueue_on_commit
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.signals import job_dead_lettered, job_enqueued, job_finished, job_started
from tests.factories import JobFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


class ReceiverFailed(Exception):
    pass


@pytest.fixture
def raising(caplog):
    """Connect a raising receiver (and a counting one after it) to signals; yield the count."""
    connected = []
    calls: list[str] = []

    def connect(*signals):
        for signal in signals:

            def boom(sender, **kwargs):
                raise ReceiverFailed(f"receiver broke on {sender}")

            def count(sender, signal=signal, **kwargs):
                calls.append(sender)

            signal.connect(boom, weak=False)
            signal.connect(count, weak=False)
            connected.append((signal, boom, count))
        return calls

    caplog.set_level(logging.ERROR, logger="django_jobs.signals")
    yield connect
    for signal, boom, count in connected:
        signal.disconnect(boom)
        signal.disconnect(count)


def _logged(caplog, signal_name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "django_jobs.signals" and f"signal {signal_name} " in r.getMessage()
    ]


def test_a_raising_job_enqueued_receiver_does_not_fail_the_commit(raising, caplog):
    calls = raising(job_enqueued)
    with transaction.atomic():
        Audit.objects.create(label="order")
        first = enqueue_on_commit(jobs.noop)
        second = enqueue_on_commit(jobs.noop)
    # Both jobs committed with the data, and both commit callbacks ran.
    assert set(Job.objects.values_list("id", flat=True)) == {first.id, second.id}
    assert Audit.objects.filter(label="order").exists()
    assert calls == ["tests.noop", "tests.noop"]  # the next receiver still ran, twice
    records = _logged(caplog, "job_enqueued")
    assert len(records) == 2
    assert "ReceiverFailed" in records[0].getMessage()
    assert records[0].exc_info and records[0].exc_info[0] is ReceiverFailed


def test_raising_worker_signal_receivers_fail_neither_the_job_nor_the_worker(
    raising, caplog, run_worker
):
    raising(job_started, job_finished)
    done = enqueue(jobs.record, {"label": "ran"})
    enqueue(jobs.fatal)
    run_worker(concurrency=1)
    # The job whose job_started receiver raised still ran once and succeeded.
    assert list(Audit.objects.values_list("label", flat=True)) == ["ran"]
    assert CompletionMarker.objects.filter(job_id=done.id).exists()
    assert not Job.objects.exists()
    assert DeadLetter.objects.get().reason == DeadReason.FATAL  # its own cause, not ours
    assert len(_logged(caplog, "job_started")) == 2
    assert len(_logged(caplog, "job_finished")) == 2


def test_a_raising_dead_letter_receiver_does_not_stop_the_burial_of_unknown_names(
    raising, caplog, run_worker, settings
):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": 0}
    calls = raising(job_dead_lettered)
    JobFactory(name="tests.testapp.never_imported.a")
    JobFactory(name="tests.testapp.never_imported.b")
    good = enqueue(jobs.record, {"label": "after"})
    run_worker()
    assert DeadLetter.objects.filter(reason=DeadReason.UNKNOWN_NAME).count() == 2
    assert sorted(calls) == ["tests.testapp.never_imported.a", "tests.testapp.never_imported.b"]
    assert CompletionMarker.objects.filter(job_id=good.id).exists()
    assert len(_logged(caplog, "job_dead_lettered")) == 2
