"""Django's Tasks API on JobsBackend: declaring and enqueueing (the web process's side)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

import django
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, task, task_backends
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.test import AsyncClient, override_settings
from django.utils import timezone

from django_jobs import registry
from django_jobs.backend import JobsBackend
from django_jobs.exceptions import InvalidPayload, InvalidTaskArguments
from django_jobs.models import Job
from django_jobs.registry import Backoff
from django_jobs.tasks.backend import JobsTask
from tests.testapp import tasks
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db


def _row(result):
    return Job.objects.get(id=result.id)


def test_the_backend_supports_every_feature():
    backend = task_backends["default"]
    assert isinstance(backend, JobsBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert isinstance(tasks.add, JobsTask)


def test_enqueue_writes_a_job_named_by_the_module_path():
    result = tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert uuid.UUID(result.id)
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert result.enqueued_at is not None and result.worker_ids == [] and result.errors == []
    row = _row(result)
    assert row.name == "tests.testapp.tasks.add"
    assert json.loads(row.payload) == {"args": [2], "kwargs": {"b": 3}}
    assert (row.queue, row.priority, row.attempts) == ("default", 0, 0)
    assert row.max_attempts == 3  # the backend's OPTIONS["MAX_ATTEMPTS"]


def test_priority_and_queue_are_the_jobs():
    assert _row(tasks.record_urgent.enqueue("a")).priority == 50
    assert _row(tasks.add.using(priority=-100).enqueue(1, 1)).priority == -100
    assert _row(tasks.add.using(priority=100).enqueue(1, 1)).priority == 100
    assert _row(tasks.send_email.enqueue("ada@example.com")).queue == "emails"
    assert _row(tasks.add.using(queue_name="emails").enqueue(1, 1)).queue == "emails"


def test_priority_outside_django_range_is_refused():
    with pytest.raises(InvalidTask):
        tasks.add.using(priority=101)
    with pytest.raises(InvalidTask):
        tasks.add.using(priority=-101)


def test_run_after_sets_the_run_time():
    when = timezone.now() + dt.timedelta(hours=2)
    row = _row(tasks.add.using(run_after=when).enqueue(1, 2))
    assert row.run_at == when


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=dt.datetime(2030, 1, 1))  # noqa: DTZ001


def test_unknown_queue_is_refused_and_writes_nothing():
    with pytest.raises(InvalidTask, match="nope"):
        tasks.add.using(queue_name="nope")
    # DJANGO_JOBS["QUEUES"] is honoured too, at enqueue.
    with (
        override_settings(DJANGO_JOBS={"QUEUES": ["default"]}),
        pytest.raises(InvalidTask, match="emails"),
    ):
        tasks.send_email.enqueue("ada@example.com")
    assert Job.objects.count() == 0


def test_an_empty_queues_list_allows_any_valid_queue():
    setting = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "QUEUES": []}}
    with override_settings(TASKS=setting):
        assert _row(tasks.add.using(queue_name="reports").enqueue(1, 1)).queue == "reports"
        with pytest.raises(InvalidTask, match="queue"):
            tasks.add.using(queue_name="no spaces")


@pytest.mark.parametrize(
    "argument",
    [
        dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
        dt.date(2030, 1, 1),
        decimal.Decimal("1.5"),
        uuid.UUID(int=1),
        {1, 2},
        b"bytes",
        object(),
        {1: "int key"},
        {"nested": [{"deep": float("nan")}]},
        float("inf"),
    ],
    ids=lambda a: type(a).__name__,
)
def test_non_json_arguments_are_refused_and_write_nothing(argument):
    with pytest.raises(InvalidTaskArguments) as raised:
        tasks.echo.enqueue(argument)
    # Django's own backends raise TypeError; django-jobs' callers catch InvalidPayload.
    assert isinstance(raised.value, TypeError)
    assert isinstance(raised.value, InvalidPayload)
    with pytest.raises(InvalidTaskArguments):
        tasks.echo.enqueue(value=argument)
    assert Job.objects.count() == 0


def test_a_model_instance_argument_gets_the_pass_its_pk_hint():
    audit = Audit.objects.create(label="x")
    with pytest.raises(InvalidTaskArguments) as raised:
        tasks.echo.enqueue(audit)
    assert "Audit is a model instance: pass its primary key instead" in str(raised.value)
    assert '{"audit_id": obj.pk}' in str(raised.value)
    assert Job.objects.count() == 0


def test_json_arguments_round_trip_exactly():
    args = ["text", 1, 1.5, True, None, [1, [2]], {"k": {"n": [True, 0.0]}}]
    result = tasks.echo.enqueue(*args, flag=False, big=2**70)
    assert json.loads(_row(result).payload) == {
        "args": args,
        "kwargs": {"flag": False, "big": 2**70},
    }
    # Tuples are JSON arrays: they arrive as lists, as Django's TaskResult.args shows them.
    assert tasks.echo.enqueue((1, 2)).args == [[1, 2]]


def test_oversized_arguments_are_refused():
    with (
        override_settings(DJANGO_JOBS={"MAX_PAYLOAD_BYTES": 100}),
        pytest.raises(InvalidPayload, match="limit"),
    ):
        tasks.echo.enqueue("x" * 200)
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1  # written in the transaction...
        raise RuntimeError("rolled back")
    assert Job.objects.count() == 0  # ...and gone with it
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
    assert _row(result).name == "tests.testapp.tasks.add"


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_is_sent_when_the_transaction_commits():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(1, 2)
            raise RuntimeError("rolled back")
        assert seen == []
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            assert seen == []
        assert seen == [(JobsBackend, result.id, TaskResultStatus.READY)]
    finally:
        task_enqueued.disconnect(receiver)


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result_from_an_async_view():
    response = async_to_sync(AsyncClient().post)("/async-enqueue/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "READY" and body["args"] == [20, 22]
    row = Job.objects.get(id=body["id"])
    assert row.name == "tests.testapp.tasks.add"


def test_tasks_of_other_backends_are_not_registered():
    assert registry.lookup("tests.testapp.tasks.add") is not None
    assert registry.lookup("tests.testapp.tasks.elsewhere") is None
    assert not isinstance(tasks.elsewhere.get_backend(), JobsBackend)


def test_a_task_sent_to_another_backend_with_using_is_not_ours():
    immediate = tasks.add.using(backend="immediate")
    assert immediate.enqueue(2, 2).return_value == 4  # ran at once, in this process
    assert Job.objects.count() == 0


# ---- per-task retry policy -----------------------------------------------------


def module_level_function():
    return "ran"


async def module_level_coroutine():
    return "ran"


@pytest.fixture
def declared():
    """Declare tasks on module_level_function; unregister them afterwards."""
    yield
    registry.unregister(f"{__name__}.module_level_function")
    registry.unregister(f"{__name__}.module_level_coroutine")


def test_options_set_the_default_and_per_task_policy():
    handler = registry.lookup("tests.testapp.tasks.explode")
    assert handler.get_max_attempts() == 2  # OPTIONS["TASKS"]["tests.testapp.tasks.explode"]
    assert _row(tasks.explode.enqueue("x")).max_attempts == 2
    assert _row(tasks.add.enqueue(1, 1)).max_attempts == 3  # OPTIONS["MAX_ATTEMPTS"]


def test_options_policy_follows_the_settings(declared):
    setting = {
        "default": {
            "BACKEND": "django_jobs.backend.JobsBackend",
            "OPTIONS": {
                "MAX_ATTEMPTS": 9,
                "BACKOFF": 7,
                "TIMEOUT": 12,
                "TASKS": {f"{__name__}.module_level_function": {"max_attempts": 4, "atomic": True}},
            },
        }
    }
    with override_settings(TASKS=setting):
        declared_task = task(module_level_function)
        result = declared_task.enqueue()
        handler = registry.lookup(f"{__name__}.module_level_function")
        assert (handler.get_max_attempts(), handler.atomic) == (4, True)
        assert handler.get_backoff() == Backoff.fixed(7)
        assert handler.get_timeout() == 12.0
        assert _row(result).max_attempts == 4
        assert _row(tasks.add.enqueue(1, 1)).max_attempts == 9


@pytest.mark.skipif(
    django.VERSION < (6, 1), reason="@task passes extra arguments to task_class from Django 6.1"
)
def test_task_decorator_arguments_set_the_policy(declared):
    declared_task = task(
        max_attempts=7, backoff={"kind": "fixed", "base": 3, "ceiling": 3}, timeout=2.5, atomic=True
    )(module_level_function)
    assert isinstance(declared_task, JobsTask)
    assert declared_task.backoff == Backoff.fixed(3)
    handler = registry.lookup(f"{__name__}.module_level_function")
    assert handler.get_max_attempts() == 7
    assert handler.get_backoff() == Backoff.fixed(3)
    assert handler.get_timeout() == 2.5
    assert handler.atomic is True
    assert _row(declared_task.enqueue()).max_attempts == 7
    # The policy survives .using() and pickling-free copies of the Task.
    assert declared_task.using(priority=5).max_attempts == 7
    assert hash(declared_task)


@pytest.mark.skipif(
    django.VERSION < (6, 1), reason="@task passes extra arguments to task_class from Django 6.1"
)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": "3"}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"backoff": "soon"}, "backoff"),
    ],
)
def test_invalid_policy_arguments_are_refused(declared, options, message):
    with pytest.raises(InvalidTask, match=message):
        task(**options)(module_level_function)
    assert registry.lookup(f"{__name__}.module_level_function") is None


@pytest.mark.skipif(
    django.VERSION < (6, 1), reason="@task passes extra arguments to task_class from Django 6.1"
)
def test_atomic_async_task_is_refused(declared):
    with pytest.raises(InvalidTask, match="atomic"):
        task(atomic=True)(module_level_coroutine)


def test_invalid_options_refuse_the_tasks_that_use_them():
    setting = {
        "default": {"BACKEND": "django_jobs.backend.JobsBackend", "OPTIONS": {"MAX_ATTEMPTS": 0}}
    }
    with override_settings(TASKS=setting), pytest.raises(InvalidTask, match="max_attempts"):
        tasks.add.enqueue(1, 2)
    assert Job.objects.count() == 0


def test_a_native_handler_name_cannot_be_taken_by_a_task(declared):
    from django_jobs import job

    def occupant(payload, ctx):
        return "ran"

    job(name=f"{__name__}.module_level_function")(occupant)
    with pytest.raises(InvalidTask, match="taken"):
        task(module_level_function)
