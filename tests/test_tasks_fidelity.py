"""Django's Tasks API on JobsBackend: enqueue's result and the worker's logs match Django's."""

from __future__ import annotations

import logging
from traceback import extract_tb

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from django.core.checks import run_checks
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("in_transaction", [False, True])
def test_the_enqueued_result_equals_get_result(in_transaction):
    # Django's own backend tests check exactly this: the result is the stored one.
    if in_transaction:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
    else:
        result = tasks.add.enqueue(1, 2)
    stored = default_task_backend.get_result(result.id)
    assert stored.enqueued_at == result.enqueued_at
    assert result == stored
    assert tasks.add.get_result(result.id) == result


def test_the_failed_task_finished_line_carries_the_exception(run_worker, caplog):
    result = tasks.explode.enqueue("boom")
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        run_worker()
    assert tasks.explode.get_result(result.id).status == TaskResultStatus.FAILED
    (failed,) = [
        record
        for record in caplog.records
        if record.name == "django.tasks" and "state=FAILED" in record.getMessage()
    ]
    assert failed.levelno == logging.ERROR
    assert result.id in failed.getMessage()
    # As from Django's ImmediateBackend: the traceback of the task's exception.
    assert failed.exc_info is not None
    kind, error, traceback = failed.exc_info
    assert kind is ValueError and str(error) == "boom"
    assert "raise ValueError(message)" in caplog.text
    # Sending the signal leaves the exception's own traceback as the worker had it.
    assert "_send_in_handler" not in [frame.name for frame in extract_tb(error.__traceback__)]
    assert "explode" in [frame.name for frame in extract_tb(traceback)]
    successful = [r for r in caplog.records if "state=SUCCESSFUL" in r.getMessage()]
    assert all(r.exc_info is None for r in successful)


def test_a_successful_task_finished_line_has_no_exception(run_worker, caplog):
    result = tasks.add.enqueue(2, 3)
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        run_worker()
    (line,) = [r for r in caplog.records if "state=SUCCESSFUL" in r.getMessage()]
    assert result.id in line.getMessage()
    assert line.exc_info is None


@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"MAX_ATTEMPTS": 2**40}, "django_jobs.E103"),
        ({"TIMEOUT": 1e13}, "django_jobs.E103"),
        ({"TIMEOUT": float("nan")}, "django_jobs.E103"),
        ({"BACKOFF": 1e13}, "django_jobs.E103"),
        ({"TASKS": {"shop.tasks.x": {"max_attempts": 2**31}}}, "django_jobs.E104"),
        ({"TASKS": {"shop.tasks.x": {"timeout": 10**400}}}, "django_jobs.E104"),
        (
            {"TASKS": {"shop.tasks.x": {"backoff": {"kind": "fixed", "base": 1, "ceiling": 1e13}}}},
            "django_jobs.E104",
        ),
    ],
)
@pytest.mark.django_db(transaction=True, databases=["default", "other", "jobs2"])
def test_task_policies_out_of_range_are_reported_and_refused(options, check_id):
    setting = {"default": {"BACKEND": "django_jobs.backend.JobsBackend", "OPTIONS": options}}
    with override_settings(TASKS=setting):
        assert check_id in {m.id for m in run_checks() if m.id.startswith("django_jobs")}
        if "TASKS" not in options:
            with pytest.raises(InvalidTask):
                tasks.add.enqueue(1, 2)


def test_a_megabyte_error_is_not_logged_whole(run_worker, caplog):
    # The stored error is capped; the log line must not carry the 10 MB message either.
    result = tasks.explode_big.enqueue(10_000_000)
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        run_worker()
    assert tasks.explode_big.get_result(result.id).status == TaskResultStatus.FAILED
    failed = [r for r in caplog.records if "state=FAILED" in r.getMessage()]
    assert failed
    assert all(r.exc_info is None for r in failed)
    assert len(caplog.text) < 1_000_000
