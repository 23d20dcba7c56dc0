"""Admin pages of operations: schedules, queues (pause/resume), workers, running jobs (cancel)."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.contrib.admin import site
from django.contrib.admin.models import LogEntry
from django.test import RequestFactory, override_settings
from django.utils import timezone

from django_jobs import limits
from django_jobs.models import DeadLetter, DeadReason, Job, QueueState, RunningJob, Schedule
from django_jobs.worker import ticker
from tests.admin_fixtures import action, action_names, url
from tests.factories import JobFactory, WorkerBeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

NIGHTLY = {"SCHEDULES": {"nightly": {"cron": "0 3 * * *", "job": "tests.noop"}}}


@pytest.fixture
def root(make_user):
    return make_user(superuser=True)


@pytest.fixture
def root_client(client, root):
    client.force_login(root)
    return client


def test_pages_render(root_client):
    with override_settings(DJANGO_JOBS=NIGHTLY):
        ticker.sync()
        QueueState.objects.ensure(["default"])
        WorkerBeatFactory(id="h:1:aa", pid=1)
        JobFactory(leased=True, worker="h:1:aa")
        JobFactory(run_at=timezone.now() - timedelta(seconds=90))
        created = time.monotonic()
        for model in ("schedule", "queuestate", "workerbeat", "runningjob"):
            response = root_client.get(url(f"{model}_changelist"))
            assert response.status_code == 200, model
        page = root_client.get(url("schedule_changelist")).content.decode()
        assert "nightly" in page and "0 3 * * * (UTC)" in page
        page = root_client.get(url("queuestate_changelist")).content.decode()
        waited = re.search(r'class="field-oldest_wait">([^<]+)<', page)[1]
        span = range(90, 92 + int(time.monotonic() - created))
        assert waited in {limits.format_duration(seconds) for seconds in span}
        assert root_client.get(url("schedule_change", "nightly")).status_code == 200


def test_pause_and_resume_actions(root_client, root):
    QueueState.objects.ensure(["default", "emails"])
    response = action(root_client, "queuestate", "pause_queues", ["emails"])
    assert "Paused 1 queue(s)" in response.content.decode()
    state = QueueState.objects.get(name="emails")
    assert (state.paused, state.paused_by) == (True, root.username)
    assert not QueueState.objects.get(name="default").paused
    action(root_client, "queuestate", "resume_queues", ["emails"])
    assert not QueueState.objects.get(name="emails").paused


def test_enable_and_disable_schedules(root_client):
    with override_settings(DJANGO_JOBS=NIGHTLY):
        ticker.sync()
    action(root_client, "schedule", "disable_schedules", ["nightly"])
    assert Schedule.objects.get().enabled is False
    action(root_client, "schedule", "enable_schedules", ["nightly"])
    assert Schedule.objects.get().enabled is True


def test_cancel_action_flags_running_jobs(root_client):
    running = JobFactory(leased=True)
    response = action(root_client, "runningjob", "cancel_jobs", [running.id])
    assert "asked the workers of 1 running job(s)" in response.content.decode()
    assert Job.objects.get(id=running.id).cancel_requested_at is not None
    assert not DeadLetter.objects.exists()  # the worker decides when the handler stops
    entry = LogEntry.objects.get()  # recorded as on the jobs list: one action, one behaviour
    assert (entry.object_id, entry.change_message) == (
        str(running.id),
        "Cancel requested: its worker stops it at its next heartbeat.",
    )


def test_cancel_needs_the_cancel_permission(make_user, client):
    viewer = make_user("view_runningjob")
    client.force_login(viewer)
    running = JobFactory(leased=True)
    page = client.get(url("runningjob_changelist"))
    assert page.status_code == 200
    assert "cancel_jobs" not in action_names(page)
    action(client, "runningjob", "cancel_jobs", [running.id])
    assert Job.objects.get(id=running.id).cancel_requested_at is None
    client.force_login(make_user("view_runningjob", "cancel_job"))
    assert "cancel_jobs" in action_names(client.get(url("runningjob_changelist")))
    action(client, "runningjob", "cancel_jobs", [running.id])
    assert Job.objects.get(id=running.id).cancel_requested_at is not None


def test_waiting_jobs_cancelled_through_the_action_become_dead_letters(root, monkeypatch):
    # The running-jobs page lists leased jobs only; the action itself handles waiting ones too
    # (for the main job admin to reuse it).
    waiting = JobFactory()
    request = RequestFactory().post(url("runningjob_changelist"))
    request.user = root
    modeladmin = site._registry[RunningJob]
    entry = modeladmin.get_actions(request)["cancel_jobs"]
    cancel_jobs = entry.func if hasattr(entry, "func") else entry[0]  # an Action from Django 6.1
    messages = []
    monkeypatch.setattr(
        modeladmin, "message_user", lambda request, message, level: messages.append(message)
    )
    cancel_jobs(modeladmin, request, Job.objects.filter(id=waiting.id))
    letter = DeadLetter.objects.get(id=waiting.id)
    assert letter.reason == DeadReason.CANCELLED and f"by {root.username}" in letter.error
    assert messages == ["1 cancelled (moved to the dead letters, where they can be replayed)."]
    assert LogEntry.objects.get().object_id == str(waiting.id)


def test_queue_list_counts_each_queue_as_counts_by_queue_does(root_client):
    QueueState.objects.ensure(["default", "emails", "idle"])
    now = timezone.now()
    JobFactory.create_batch(2, queue="emails", run_at=now - timedelta(seconds=5))
    JobFactory(queue="emails", run_at=now + timedelta(hours=1))
    JobFactory(queue="emails", leased=True)
    JobFactory(queue="default", run_at=now - timedelta(seconds=5))
    response = root_client.get(url("queuestate_changelist"))
    shown = {
        q.name: (q.n_waiting, q.n_scheduled, q.n_running, q.oldest_run_at is not None)
        for q in response.context["cl"].result_list
    }
    assert shown == {
        "default": (1, 0, 0, True),
        "emails": (2, 1, 1, True),
        "idle": (0, 0, 0, False),  # no job: zeros, not an empty cell
    }
    counted = {
        row["queue"]: (row["waiting"], row["scheduled"], row["running"], row["oldest"] is not None)
        for row in Job.objects.counts_by_queue()
    }
    assert {name: row for name, row in shown.items() if name != "idle"} == counted


def test_queue_list_counts_blocked_steps_apart(root_client):
    from django_jobs.models import blocked_until

    QueueState.objects.ensure(["emails"])
    JobFactory(queue="emails", run_at=timezone.now() + timedelta(hours=1))
    JobFactory.create_batch(2, queue="emails", run_at=blocked_until(), waiting_for=3)
    response = root_client.get(url("queuestate_changelist"))
    (emails,) = response.context["cl"].result_list
    assert (emails.n_waiting, emails.n_scheduled, emails.n_running, emails.n_blocked) == (
        0,
        1,
        0,
        2,
    )
    assert "column-blocked" in response.text
