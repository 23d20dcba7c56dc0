"""Django's Tasks API on JobsBackend: what the worker does with tasks (in-process worker)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils import timezone

from django_jobs import enqueue
from django_jobs.backend import JobsBackend
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.signals import job_finished
from tests.factories import JobFactory
from tests.testapp import tasks
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


def test_worker_serves_the_queues_of_tasks(run_worker):
    tasks.send_email.enqueue("ada@example.com")
    run_worker()
    assert list(Audit.objects.values_list("label", flat=True)) == ["email:ada@example.com"]


def test_higher_priority_runs_first(run_worker):
    for priority, label in [
        (-50, "low"),
        (0, "normal"),
        (90, "urgent"),
        (-100, "lowest"),
        (100, "highest"),
    ]:
        tasks.record.using(priority=priority).enqueue(label)
    run_worker(concurrency=1)
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == [
        "highest",
        "urgent",
        "normal",
        "low",
        "lowest",
    ]


def test_run_after_is_honoured(run_worker):
    later = tasks.record.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue("later")
    past = tasks.record.using(run_after=timezone.now() - dt.timedelta(seconds=1)).enqueue("past")
    run_worker()
    assert list(Audit.objects.values_list("label", flat=True)) == ["past"]
    assert tasks.record.get_result(later.id).status == TaskResultStatus.READY
    assert tasks.record.get_result(past.id).status == TaskResultStatus.SUCCESSFUL
    # Once due, it runs.
    Job.objects.filter(id=later.id).update(run_at=timezone.now())
    run_worker()
    assert tasks.record.get_result(later.id).return_value == "later"


def test_async_tasks_run_together_on_the_workers_event_loop(run_worker):
    results = [tasks.async_nap.enqueue(0.3) for _ in range(20)]
    run_worker(concurrency=1)  # one thread: only the loop runs them side by side
    peaks = [tasks.async_nap.get_result(r.id).return_value for r in results]
    assert len(peaks) == 20
    assert max(peaks) > 1, peaks


def test_async_task_receives_its_context(run_worker):
    result = tasks.async_context.enqueue()
    run_worker()
    assert tasks.async_context.get_result(result.id).return_value == 1


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "antigravity",
        "tests.testapp.never_imported.run",
        "tests.testapp.tasks.elsewhere",
    ],
)
def test_rows_naming_anything_but_our_tasks_are_dead_lettered_without_an_import(
    run_worker, name, settings
):
    # Once no live worker has known the name for UNKNOWN_NAME_GRACE (here at once).
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": 0}
    module = name.rpartition(".")[0] if name != "antigravity" else "antigravity"
    was_loaded = module in sys.modules
    row = JobFactory(name=name, payload=json.dumps({"args": ["echo pwned"], "kwargs": {}}))
    run_worker()
    letter = DeadLetter.objects.get(id=row.id)
    assert letter.reason == DeadReason.UNKNOWN_NAME
    assert (module in sys.modules) == was_loaded
    assert "antigravity" not in sys.modules and "tests.testapp.never_imported" not in sys.modules
    assert not Audit.objects.exists()  # tests.testapp.tasks.elsewhere did not run either


def test_signals_are_sent_with_the_right_status(run_worker):
    events = []

    def on_started(sender, task_result, **kwargs):
        events.append(("started", sender, task_result.id, task_result.status, task_result.attempts))

    def on_finished(sender, task_result, **kwargs):
        value = (
            task_result.return_value if task_result.status == TaskResultStatus.SUCCESSFUL else None
        )
        events.append(
            ("finished", sender, task_result.id, task_result.status, len(task_result.errors), value)
        )

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        dead = tasks.explode.enqueue("boom")
        retried = tasks.flaky.enqueue(2)
        coroutine = tasks.async_record.enqueue("signals")
        run_worker(concurrency=1)
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert [e for e in events if e[2] == ok.id] == [
        ("started", JobsBackend, ok.id, TaskResultStatus.RUNNING, 1),
        ("finished", JobsBackend, ok.id, TaskResultStatus.SUCCESSFUL, 0, 3),
    ]
    # A failed attempt that will be retried is not finished; the dead letter is.
    assert [e for e in events if e[2] == dead.id] == [
        ("started", JobsBackend, dead.id, TaskResultStatus.RUNNING, 1),
        ("started", JobsBackend, dead.id, TaskResultStatus.RUNNING, 2),
        ("finished", JobsBackend, dead.id, TaskResultStatus.FAILED, 2, None),
    ]
    assert [e for e in events if e[2] == coroutine.id] == [
        ("started", JobsBackend, coroutine.id, TaskResultStatus.RUNNING, 1),
        ("finished", JobsBackend, coroutine.id, TaskResultStatus.SUCCESSFUL, 0, "async:signals"),
    ]
    flaky = [e for e in events if e[2] == retried.id]
    assert [(e[0], e[3]) for e in flaky] == [
        ("started", TaskResultStatus.RUNNING),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert flaky[-1][4:] == (
        1,
        {"attempt": 2, "workers": tasks.flaky.get_result(retried.id).worker_ids},
    )


def test_a_failing_signal_receiver_neither_fails_the_task_nor_stops_the_worker(run_worker):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_started.connect(broken)
    task_finished.connect(broken)
    try:
        result = tasks.add.enqueue(1, 1)
        worker = run_worker()
    finally:
        task_started.disconnect(broken)
        task_finished.disconnect(broken)
    assert worker.stats.succeeded == 1
    assert tasks.add.get_result(result.id).return_value == 2


def test_task_finished_for_a_task_dead_lettered_without_running(run_worker):
    finished = []

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    row = JobFactory(name="tests.testapp.tasks.add", payload="[]")
    task_finished.connect(on_finished)
    try:
        run_worker()
    finally:
        task_finished.disconnect(on_finished)
    assert finished == [(str(row.id), TaskResultStatus.FAILED)]


def test_native_job_signals_are_still_sent_for_tasks(run_worker):
    outcomes = []

    def on_job_finished(sender, outcome, **kwargs):
        outcomes.append((sender, outcome))

    job_finished.connect(on_job_finished)
    try:
        tasks.flaky.enqueue(2)
        run_worker()
    finally:
        job_finished.disconnect(on_job_finished)
    assert outcomes == [
        ("tests.testapp.tasks.flaky", "retried"),
        ("tests.testapp.tasks.flaky", "succeeded"),
    ]


def test_a_dead_lettered_task_replays_like_any_job(run_worker):
    result = tasks.explode.enqueue("boom")
    run_worker()
    letter = DeadLetter.objects.get(id=result.id)
    # What a replay does: a new job with the dead letter's name, payload, queue and priority.
    replay = enqueue(
        letter.name, json.loads(letter.payload), queue=letter.queue, priority=letter.priority
    )
    run_worker()
    replayed = tasks.explode.get_result(str(replay.id))
    assert replayed.status == TaskResultStatus.FAILED and replayed.args == ["boom"]
    assert len(replayed.errors) == 2  # the task's own policy: two attempts again


def test_a_replayed_task_that_now_succeeds(run_worker):
    result = tasks.record.enqueue("replayed")
    Job.objects.filter(id=result.id).update(payload=json.dumps({"args": [], "kwargs": {}}))
    run_worker()  # record() without its argument: TypeError, three times
    letter = DeadLetter.objects.get(id=result.id)
    assert tasks.record.get_result(result.id).errors[0].exception_class is TypeError
    replay = enqueue(letter.name, {"args": ["replayed"], "kwargs": {}}, queue=letter.queue)
    run_worker()
    assert tasks.record.get_result(str(replay.id)).return_value == "replayed"
    assert CompletionMarker.objects.filter(job_id=replay.id).exists()


def test_atomic_policy_commits_effects_with_the_marker(run_worker, settings):
    settings.TASKS = {
        **settings.TASKS,
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {"TASKS": {"tests.testapp.tasks.record": {"atomic": True}}},
        },
    }
    result = tasks.record.enqueue("atomic")
    from django_jobs import registry

    assert registry.lookup("tests.testapp.tasks.record").atomic is True
    run_worker()
    assert tasks.record.get_result(result.id).return_value == "atomic"
    assert Audit.objects.get().label == "atomic"


def test_timeout_policy_fails_a_slow_attempt(run_worker, settings):
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "OPTIONS": {"TIMEOUT": 0.3, "MAX_ATTEMPTS": 1}},
    }
    result = tasks.sleepy.enqueue(1.0, "slow")
    run_worker()
    failed = tasks.sleepy.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is TimeoutError
    # Let the abandoned thread finish before the database is flushed.
    for thread in threading.enumerate():
        if thread.name.startswith("django-jobs-executor"):
            thread.join(timeout=5)
