"""Django's Tasks API on JobsBackend: TaskResults read back from jobs, markers and dead letters."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
from django.utils import timezone

from django_jobs import enqueue
from django_jobs.exceptions import LeaseExpired
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.worker import Worker
from tests.conftest import wait_for
from tests.factories import JobFactory
from tests.testapp import jobs, tasks
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


def test_ready_result_of_a_waiting_task():
    result = tasks.add.enqueue(2, 3)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.id == result.id
    assert (fetched.args, fetched.kwargs) == ([2, 3], {})
    assert fetched.task.func is tasks.add.func
    assert fetched.backend == "default"
    assert fetched.enqueued_at == Job.objects.get().enqueued_at
    assert (fetched.started_at, fetched.finished_at, fetched.last_attempted_at) == (
        None,
        None,
        None,
    )
    assert (fetched.worker_ids, fetched.attempts, fetched.errors) == ([], 0, [])
    assert not fetched.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = fetched.return_value


def test_successful_result_after_the_worker_ran_it(run_worker):
    result = tasks.add.enqueue(2, 3)
    before = timezone.now()
    worker = run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.worker_ids == [worker.id] and result.attempts == 1
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert result.finished_at >= before
    assert (result.args, result.kwargs) == ([2, 3], {})
    marker = CompletionMarker.objects.get()
    assert str(marker.job_id) == result.id
    assert result.finished_at == marker.completed_at


def test_async_task_runs_and_returns(run_worker):
    result = tasks.async_record.enqueue("hello")
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "async:hello"
    assert list(Audit.objects.values_list("label", flat=True)) == ["hello"]


def test_return_value_is_json_normalised(run_worker):
    result = tasks.echo.enqueue(1, x=[1, 2])
    run_worker()
    assert tasks.echo.get_result(result.id).return_value == {"args": [1], "kwargs": {"x": [1, 2]}}


def test_running_result_while_the_worker_holds_it():
    result = tasks.sleepy.enqueue(1.0, "held")
    worker = Worker(burst=True, concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(
            lambda: Audit.objects.filter(label="start:held").exists(), message="the task to start"
        )
        running = tasks.sleepy.get_result(result.id)
        assert running.status == TaskResultStatus.RUNNING
        assert running.worker_ids == [worker.id] and running.attempts == 1
        assert running.started_at is not None and running.last_attempted_at == running.started_at
        assert running.finished_at is None
        with pytest.raises(ValueError, match="not finished"):
            _ = running.return_value
    finally:
        thread.join(timeout=30)
    running.refresh()
    assert running.status == TaskResultStatus.SUCCESSFUL and running.return_value == "held"


def test_retried_task_is_ready_again_with_the_errors_so_far(run_worker, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "BACKOFF": 3600}
    result = tasks.flaky.enqueue(succeed_on=2)
    worker = run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1 and result.worker_ids == [worker.id]
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    assert "flaky failure on attempt 1" in result.errors[0].traceback
    assert result.started_at is not None and result.last_attempted_at is not None


def test_successful_after_retries_keeps_every_attempt(run_worker):
    result = tasks.flaky.enqueue(3)
    worker = run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3 and result.worker_ids == [worker.id] * 3
    # takes_context: the function saw the attempt number and one worker id per attempt.
    assert result.return_value == {"attempt": 3, "workers": [worker.id] * 3}
    assert list(Audit.objects.order_by("id").values_list("attempt", flat=True)) == [1, 2, 3]
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 1" in result.errors[0].traceback and "attempt 2" in result.errors[1].traceback
    assert result.started_at < result.last_attempted_at <= result.finished_at


def test_failed_result_from_the_dead_letter(run_worker):
    result = tasks.explode.enqueue("boom")
    worker = run_worker()
    result.refresh()
    letter = DeadLetter.objects.get()
    assert str(letter.id) == result.id and letter.attempts == 2
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert result.finished_at == letter.dead_at
    assert result.attempts == 2 and result.worker_ids == [worker.id, worker.id]
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "Traceback" in error.traceback and "ValueError: boom" in error.traceback
    assert result.args == ["boom"]
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_non_json_return_value_fails_the_attempt(run_worker):
    result = tasks.bad_return.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [TypeError] * 3


def test_a_lost_attempt_is_an_error_with_an_importable_class(run_worker):
    result = tasks.add.enqueue(1, 1)
    Job.objects.filter(id=result.id).update(
        locked_by="dead-host:1:abc#1",
        lease_expires_at=timezone.now() - dt.timedelta(seconds=5),
        attempts=1,
    )
    assert (
        tasks.add.get_result(result.id).status == TaskResultStatus.READY
    )  # lease expired: not running
    worker = run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == ["dead-host:1:abc", worker.id]
    assert [e.exception_class for e in result.errors] == [LeaseExpired]


def test_unknown_ids_raise_task_result_does_not_exist():
    native = enqueue(jobs.record, {"label": "native"})
    for result_id in (str(uuid.uuid4()), "not-a-uuid", "", str(native.id)):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result(result_id)


def test_a_result_of_another_task_is_a_mismatch(run_worker):
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        tasks.record.get_result(result.id)
    run_worker()
    with pytest.raises(TaskResultMismatch):
        tasks.record.get_result(result.id)
    assert tasks.add.get_result(result.id).return_value == 2


def test_aget_result_and_arefresh(run_worker):
    result = tasks.add.enqueue(4, 5)
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.READY
    run_worker()
    async_to_sync(fetched.arefresh)()
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 9


def test_result_shows_the_queue_and_priority_it_was_enqueued_with(run_worker):
    result = tasks.add.using(priority=-7, queue_name="emails").enqueue(1, 1)
    fetched = tasks.add.get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name) == (-7, "emails")
    run_worker(queues=["emails"])
    assert tasks.add.get_result(result.id).task.queue_name == "emails"


def test_a_row_with_a_bad_payload_is_dead_lettered_and_failed(run_worker):
    row = JobFactory(name="tests.testapp.tasks.add", payload=json.dumps({"a": 1}))
    run_worker()
    letter = DeadLetter.objects.get(id=row.id)
    assert letter.reason == "invalid_payload"
    result = tasks.add.get_result(str(row.id))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is ValueError
    assert (result.args, result.kwargs) == ([], {})


def test_enqueue_and_get_result_cost_few_queries(run_worker, django_assert_num_queries):
    later = tasks.add.using(run_after=timezone.now() + dt.timedelta(hours=1))
    with django_assert_num_queries(1):
        waiting = later.enqueue(1, 2)
    done = tasks.add.enqueue(3, 4)
    dead = tasks.explode.enqueue("boom")
    run_worker()
    with django_assert_num_queries(1):  # the live job
        assert tasks.add.get_result(waiting.id).status == TaskResultStatus.READY
    with django_assert_num_queries(2):  # no live job, then the marker
        assert tasks.add.get_result(done.id).status == TaskResultStatus.SUCCESSFUL
    with django_assert_num_queries(3):  # no live job, no marker, then the dead letter
        assert tasks.explode.get_result(dead.id).status == TaskResultStatus.FAILED
