"""Django's Tasks API on JobsBackend with real `runjobs` processes."""

from __future__ import annotations

import signal
import time

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from django.db import transaction
from django.tasks import TaskResultStatus
from django.test import Client

from django_jobs.models import CompletionMarker, Job
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Audit, Order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _labels(prefix=""):
    return sorted(Audit.objects.filter(label__startswith=prefix).values_list("label", flat=True))


def test_tasks_enqueued_in_a_view_run_only_if_its_transaction_commits(worker_process):
    client = Client(raise_request_exception=False)
    committed = client.post("/task-orders/", {"item": "book"})
    assert committed.status_code == 200
    failed = client.post("/task-orders/", {"item": "kite", "fail": "1"})
    assert failed.status_code == 500
    assert Order.objects.count() == 1
    worker = worker_process("--burst")
    assert worker.wait() == 0, worker.output()
    order = Order.objects.get()
    assert _labels() == [f"order-{order.pk}"]
    assert Job.objects.count() == 0
    result = tasks.record.get_result(committed.content.decode())
    assert (
        result.status == TaskResultStatus.SUCCESSFUL and result.return_value == f"order-{order.pk}"
    )


def test_a_running_worker_sees_the_task_only_after_the_commit(worker_process):
    worker = worker_process("--poll-interval", "0.1")
    wait_for(lambda: "starting" in worker.output(), timeout=30, message="the worker to start")
    with transaction.atomic():
        result = tasks.record.enqueue("after-commit")
        time.sleep(0.5)  # a few polls: the uncommitted job is invisible to the worker
        assert not Audit.objects.exists()
    wait_for(
        lambda: _labels() == ["after-commit"],
        timeout=30,
        message="the task to run after the commit",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert tasks.record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_signals_come_from_the_worker_process_and_refresh_sees_its_results(worker_process):
    ok = tasks.add.enqueue(20, 22)
    dead = tasks.explode.enqueue("boom")
    assert ok.status == TaskResultStatus.READY
    worker = worker_process("--burst", "--concurrency", "1", extra_env={"TASK_SIGNALS_AUDIT": "1"})
    assert worker.wait() == 0, worker.output()
    # refresh() reads what the other process wrote.
    ok.refresh()
    dead.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 42
    host_pid = ok.worker_ids[0].split(":")[:2]
    assert host_pid[1] == str(worker.pid)
    assert dead.status == TaskResultStatus.FAILED and len(dead.errors) == 2
    assert [e.exception_class for e in dead.errors] == [ValueError, ValueError]
    pid = worker.pid
    assert _labels("signal:") == sorted(
        [
            f"signal:started:RUNNING:{ok.id}:{pid}",
            f"signal:finished:SUCCESSFUL:{ok.id}:{pid}",
            f"signal:started:RUNNING:{dead.id}:{pid}",
            f"signal:started:RUNNING:{dead.id}:{pid}",
            f"signal:finished:FAILED:{dead.id}:{pid}",
        ]
    )
    assert CompletionMarker.objects.count() == 1
