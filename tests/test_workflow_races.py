"""Workflows against running workers: cancels and re-enqueued parents (docs/workflows.md).

Found by the black-box tests (tests/test_workflow_blackbox.py's handlers): a cancel
that met a settle releasing a step skipped that step as running, and left it
blocked for good; a key enqueued again after its letter did not release the jobs
waiting for the letter.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.core.management import call_command
from django.db import transaction

from django_jobs import cancel_workflow, enqueue, workflow
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, WorkerBeat
from tests.conftest import ENGINE, wait_for
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)
STEP = "tests.bb.step"


@pytest.mark.skipif(ENGINE == "sqlite", reason="not on SQLite: one writer at a time, no race")
@pytest.mark.parametrize("run", range(3))
def test_cancelling_a_workflow_while_workers_settle_it_leaves_no_step_behind(worker_process, run):
    # 8 layers of 40 steps, each after two of the layer before: the cancel lands
    # while settles release steps of the next layer (and, on MariaDB, met their
    # locks in a deadlock). Every step ends done or cancelled, none blocked.
    layers, width = 8, 40
    with transaction.atomic(), workflow(name="mid-run") as w:
        previous: list = []
        for layer in range(layers):
            previous = [
                w.enqueue(STEP, {"label": f"s{layer}-{i}", "ms": 2}, after=previous[i : i + 2])
                for i in range(width)
            ]
    workers = [worker_process("--concurrency", "4", "--heartbeat", "0.3") for _ in range(2)]
    try:
        wait_for(lambda: WorkerBeat.objects.count() >= 2, message="two workers")
        wait_for(lambda: CompletionMarker.objects.count() >= width, message="the first layer")
        result = cancel_workflow("mid-run", by="tester")
        deadline = time.monotonic() + 30
        while Job.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = list(Job.objects.values("id", "waiting_for", "locked_by", "cancel_requested_at"))
    finally:
        for process in workers:
            process.signal(signal.SIGTERM)
        for process in workers:
            process.wait()
    assert left == [], (result, left)
    done = CompletionMarker.objects.count()
    cancelled = DeadLetter.objects.filter(reason=DeadReason.CANCELLED).count()
    assert done + cancelled == layers * width
    assert cancelled >= result.cancelled


def test_a_waiting_child_is_released_when_its_dead_parents_key_is_enqueued_again():
    # A dead letter does not hold its key: the key enqueued again and done releases
    # the jobs that waited for the letter ("wait"), as its replay would.
    enqueue("tests.bb.fragile", {"label": "p"}, key="charge-7")
    child = enqueue(STEP, {"label": "c"}, after=["charge-7"])
    call_command("runjobs", "--burst")
    assert DeadLetter.objects.filter(key="charge-7").exists()
    assert Job.objects.get(id=child.id).waiting_for == 1
    Audit.objects.create(label="bbheal|p")  # the fix is deployed
    again = enqueue("tests.bb.fragile", {"label": "p"}, key="charge-7")
    assert Job.objects.get(id=again.id).dependents == 1
    call_command("runjobs", "--burst")
    assert CompletionMarker.objects.filter(key="charge-7").exists()
    assert not Job.objects.filter(id=child.id).exists()
    assert CompletionMarker.objects.filter(job_id=child.id).exists()
