"""Admin pages of operations: schedules, queues (pause/resume), workers, running jobs (cancel)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.http import QueryDict
from django.test import Client, override_settings
from django.utils import timezone

from django_jobs import schedules
from django_jobs.models import DeadLetter, DeadReason, Job, QueueState, Schedule, WorkerBeat
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "/admin/django_jobs"


@pytest.fixture
def admin_client():
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def _action(client, model, action, ids):
    return client.post(
        f"{BASE}/{model}/",
        {"action": action, "_selected_action": [str(i) for i in ids]},
        follow=True,
    )


def test_pages_render(admin_client):
    now = timezone.now()
    with override_settings(
        DJANGO_JOBS={"SCHEDULES": {"nightly": {"cron": "0 3 * * *", "job": "tests.noop"}}}
    ):
        schedules.sync()
        QueueState.objects.ensure(["default"])
        WorkerBeat.objects.create(id="h:1:aa", host="h", pid=1, queues=["default"], concurrency=4,
                                  started_at=now, last_seen_at=now)  # fmt: skip
        JobFactory(locked_by="h:1:aa#1", lease_expires_at=now + timedelta(seconds=30), attempts=1)
        JobFactory(run_at=now - timedelta(seconds=90))
        for model in ("schedule", "queuestate", "workerbeat", "runningjob"):
            response = admin_client.get(f"{BASE}/{model}/")
            assert response.status_code == 200, model
        page = admin_client.get(f"{BASE}/schedule/").content.decode()
        assert "nightly" in page and "0 3 * * * (UTC)" in page
        page = admin_client.get(f"{BASE}/queuestate/").content.decode()
        assert "90s" in page or "91s" in page  # the oldest wait
        assert admin_client.get(f"{BASE}/schedule/nightly/change/").status_code == 200


def test_pause_and_resume_actions(admin_client):
    QueueState.objects.ensure(["default", "emails"])
    response = _action(admin_client, "queuestate", "pause_queues", ["emails"])
    assert "Paused 1 queue(s)" in response.content.decode()
    state = QueueState.objects.get(name="emails")
    assert (state.paused, state.paused_by) == (True, "root")
    assert not QueueState.objects.get(name="default").paused
    _action(admin_client, "queuestate", "resume_queues", ["emails"])
    assert not QueueState.objects.get(name="emails").paused


def test_enable_and_disable_schedules(admin_client):
    with override_settings(
        DJANGO_JOBS={"SCHEDULES": {"nightly": {"cron": "0 3 * * *", "job": "tests.noop"}}}
    ):
        schedules.sync()
    _action(admin_client, "schedule", "disable_schedules", ["nightly"])
    assert Schedule.objects.get().enabled is False
    _action(admin_client, "schedule", "enable_schedules", ["nightly"])
    assert Schedule.objects.get().enabled is True


def test_cancel_action_flags_running_jobs(admin_client):
    running = JobFactory(
        locked_by="h:1:aa#1", lease_expires_at=timezone.now() + timedelta(seconds=30), attempts=1
    )
    response = _action(admin_client, "runningjob", "cancel_jobs", [running.id])
    assert "asked the workers of 1 running job(s)" in response.content.decode()
    assert Job.objects.get(id=running.id).cancel_requested_at is not None
    assert not DeadLetter.objects.exists()  # the worker decides when the handler stops
    entry = LogEntry.objects.get()  # recorded as on the jobs list: one action, one behaviour
    assert (entry.object_id, entry.change_message) == (
        str(running.id),
        "Cancel requested: its worker stops it at its next heartbeat.",
    )


def test_cancel_needs_the_cancel_permission():
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_runningjob"))
    client = Client()
    client.force_login(user)
    running = JobFactory(
        locked_by="h:1:aa#1", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    page = client.get(f"{BASE}/runningjob/")
    assert page.status_code == 200 and "cancel_jobs" not in page.content.decode()
    _action(client, "runningjob", "cancel_jobs", [running.id])
    assert Job.objects.get(id=running.id).cancel_requested_at is None
    user.user_permissions.add(Permission.objects.get(codename="cancel_job"))
    client.force_login(User.objects.get(pk=user.pk))
    _action(client, "runningjob", "cancel_jobs", [running.id])
    assert Job.objects.get(id=running.id).cancel_requested_at is not None


def test_waiting_jobs_cancelled_through_the_action_become_dead_letters(admin_client):
    # The running-jobs page lists leased jobs only; the action itself handles waiting ones too
    # (for the main job admin to reuse it).
    from django.contrib.admin import site

    from django_jobs.admin import cancel_jobs
    from django_jobs.models import RunningJob

    waiting = JobFactory()
    modeladmin = site._registry[RunningJob]

    class _Request:
        user = User.objects.get(username="root")
        POST = QueryDict()
        _messages = []

    modeladmin.message_user = lambda request, message, level: _Request._messages.append(message)
    try:
        cancel_jobs(modeladmin, _Request(), Job.objects.filter(id=waiting.id))
    finally:
        del modeladmin.message_user
    letter = DeadLetter.objects.get(id=waiting.id)
    assert letter.reason == DeadReason.CANCELLED and "by root" in letter.error
    assert _Request._messages == [
        "1 cancelled (moved to the dead letters, where they can be replayed)."
    ]
    assert LogEntry.objects.get().object_id == str(waiting.id)


def test_queue_list_counts_each_queue_as_counts_by_queue_does(admin_client):
    QueueState.objects.ensure(["default", "emails", "idle"])
    now = timezone.now()
    JobFactory.create_batch(2, queue="emails", run_at=now - timedelta(seconds=5))
    JobFactory(queue="emails", run_at=now + timedelta(hours=1))
    JobFactory(queue="emails", locked_by="h:1:aa#1", lease_expires_at=now + timedelta(seconds=30))
    JobFactory(queue="default", run_at=now - timedelta(seconds=5))
    response = admin_client.get(f"{BASE}/queuestate/")
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
