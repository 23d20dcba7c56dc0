"""Django's Tasks API in a workflow: enqueue_step() adds a task call to a workflow() block."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

from django_jobs import InvalidTaskArguments, workflow
from django_jobs.backend import enqueue_step
from django_jobs.models import CompletionMarker, Job, JobState, WorkflowStep
from tests.testapp import tasks
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_step_waits_for_its_parent_and_reads_back_as_a_task(run_worker):
    with transaction.atomic(), workflow(name="order-1") as w:
        a = enqueue_step(w, tasks.add, [1, 2])
        b = enqueue_step(w, tasks.record, kwargs={"label": "after-add"}, after=[a])
        mail = enqueue_step(w, tasks.send_email, ["ada@example.com"], after=[b])
    # What Task.enqueue writes, plus the wait: the task's name, payload shape and queue.
    child = Job.objects.with_state().get(id=b.id)
    assert child.state == JobState.BLOCKED and child.waiting_for == 1
    assert child.name == "tests.testapp.tasks.record"
    assert Job.objects.get(id=mail.id).queue == "emails"
    assert set(WorkflowStep.objects.values_list("job_id", flat=True)) == {a.id, b.id, mail.id}
    assert tasks.record.get_result(str(b.id)).status == TaskResultStatus.READY

    run_worker(queues=["default", "emails"])
    assert tasks.add.get_result(str(a.id)).return_value == 3
    assert tasks.record.get_result(str(b.id)).status == TaskResultStatus.SUCCESSFUL
    assert tasks.send_email.get_result(str(mail.id)).return_value == "ada@example.com"
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == [
        "after-add",
        "email:ada@example.com",
    ]
    first, second = (CompletionMarker.objects.get(job_id=i) for i in (a.id, b.id))
    assert second.started_at >= first.completed_at  # it ran after its parent finished


def test_a_task_of_another_backend_or_bad_arguments_write_nothing():
    with pytest.raises(InvalidTask, match="only a task of a JobsBackend"):
        with workflow(name="elsewhere") as w:
            enqueue_step(w, tasks.elsewhere)
    with pytest.raises(InvalidTaskArguments):
        with workflow(name="not-json") as w:
            enqueue_step(w, tasks.add, [1, 2])
            enqueue_step(w, tasks.echo, [{1, 2}])
    with pytest.raises(InvalidTask, match='on_parent_dead="dead" needs after='):
        with workflow(name="no-parents") as w:
            enqueue_step(w, tasks.add, [1, 2], on_parent_dead="dead")
    assert not Job.objects.exists() and not WorkflowStep.objects.exists()


def test_a_task_steps_run_after_holds_once_its_parent_released_it(run_worker):
    # A blocked step keeps run_after for its release: a worker runs the parent, and the
    # step is then scheduled at run_after, not run at once.
    when = timezone.now() + timedelta(hours=1)
    with transaction.atomic(), workflow(name="later") as w:
        a = enqueue_step(w, tasks.add, [1, 2])
        b = enqueue_step(w, tasks.record.using(run_after=when), kwargs={"label": "x"}, after=[a])
    assert Job.objects.get(id=b.id).not_before == when
    worker = run_worker()
    assert worker.stats.succeeded == 1
    assert tasks.add.get_result(str(a.id)).return_value == 3
    step = Job.objects.with_state().get(id=b.id)
    assert (step.waiting_for, step.state, step.run_at) == (0, JobState.SCHEDULED, when)
    assert tasks.record.get_result(str(b.id)).status == TaskResultStatus.READY
    assert not Audit.objects.exists()
