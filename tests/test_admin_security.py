"""Who may do what in the admin: view-only, replay, delete, superuser; login, staff, CSRF."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from django_jobs.models import DeadLetter, Job, QueueState, Schedule
from tests.admin_fixtures import VIEW_ONLY, action, action_names, messages_of, url
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


def test_view_only_staff_sees_the_pages_but_no_action(login):
    client = login(*VIEW_ONLY)
    letter = DeadLetterFactory()
    JobFactory()

    page = client.get(url("deadletter_changelist"))
    assert page.status_code == 200
    assert action_names(page) == []
    detail = client.get(url("deadletter_change", letter.pk))
    assert detail.status_code == 200
    assert "django-jobs-replay-form" not in detail.content.decode()
    assert action_names(client.get(url("job_changelist"))) == []
    assert client.get(url("completionmarker_changelist")).status_code == 200


def test_view_only_staff_cannot_replay_or_delete_by_a_forged_post(login):
    client = login(*VIEW_ONLY)
    letter = DeadLetterFactory()

    # Refused, and saying so: a 200 showing the list let a forged POST look accepted.
    response = action(client, "deadletter", "replay_selected", [letter.id], post="yes")
    assert response.status_code == 403
    assert client.post(url("deadletter_replay", letter.pk)).status_code == 403
    response = action(client, "deadletter", "delete_selected", [letter.id], post="yes")
    assert response.status_code == 403
    response = action(client, "deadletter", "delete_selected", [letter.id], index="0")
    assert response.status_code == 403
    assert client.post(url("deadletter_delete", letter.pk), {"post": "yes"}).status_code == 403

    assert not Job.objects.exists()
    assert DeadLetter.objects.get().replayed_at is None
    assert not LogEntry.objects.exists()


def test_replay_permission_without_delete(login):
    client = login("view_deadletter", "replay_deadletter")
    letters = DeadLetterFactory.create_batch(2)

    assert action_names(client.get(url("deadletter_changelist"))) == ["replay_selected"]
    assert (
        "django-jobs-replay-form"
        in client.get(url("deadletter_change", letters[0].pk)).content.decode()
    )
    response = action(client, "deadletter", "replay_selected", [letters[0].id], post="yes")
    assert messages_of(response) == ["1 replayed."]
    response = action(client, "deadletter", "delete_selected", [letters[1].id], post="yes")
    assert response.status_code == 403  # an action not offered to this user
    assert DeadLetter.objects.count() == 2


def test_replay_permission_alone_is_not_enough_to_see_the_list(login):
    client = login("replay_deadletter")
    assert client.get(url("deadletter_changelist")).status_code == 403


def test_delete_permission_without_replay(login):
    client = login("view_deadletter", "delete_deadletter")
    letter = DeadLetterFactory()
    assert action_names(client.get(url("deadletter_changelist"))) == ["delete_selected"]
    assert client.post(url("deadletter_replay", letter.pk)).status_code == 403
    action(client, "deadletter", "delete_selected", [letter.id], post="yes")
    assert not DeadLetter.objects.exists()


def test_superuser_has_every_action(admin_client_):
    assert sorted(action_names(admin_client_.get(url("deadletter_changelist")))) == [
        "delete_selected",
        "replay_selected",
    ]
    assert sorted(action_names(admin_client_.get(url("job_changelist")))) == ["cancel", "run_now"]
    assert action_names(admin_client_.get(url("completionmarker_changelist"))) == []


def test_job_actions_need_their_own_permissions(login):
    job = JobFactory()
    viewer = login("view_job")
    assert action(viewer, "job", "cancel", [job.id]).status_code == 403
    assert action(viewer, "job", "run_now", [job.id], index="0").status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()
    assert action(login("view_job", "run_job_now"), "job", "cancel", [job.id]).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()

    operator = login("view_job", "cancel_job")
    assert action_names(operator.get(url("job_changelist"))) == ["cancel"]
    action(operator, "job", "cancel", [job.id])
    assert not Job.objects.exists()
    assert action_names(login("view_job", "run_job_now").get(url("job_changelist"))) == ["run_now"]


@pytest.mark.parametrize(
    ("model", "name", "permission"),
    [
        ("queuestate", "pause_queues", "view_queuestate"),
        ("schedule", "disable_schedules", "view_schedule"),
        ("runningjob", "cancel_jobs", "view_runningjob"),
        ("workerbeat", "delete_selected", "view_workerbeat"),
    ],
)
def test_a_forged_action_on_the_operations_lists_answers_403(login, model, name, permission):
    QueueState.objects.ensure(["default"])
    Schedule.objects.create(name="nightly", cron="0 3 * * *", job_name="tests.noop")
    job = JobFactory(leased=True)
    ids = {
        "queuestate": ["default"],
        "schedule": ["nightly"],
        "runningjob": [job.id],
        "workerbeat": ["w:1:a"],
    }[model]
    assert action(login(permission), model, name, ids, index="0").status_code == 403
    assert not QueueState.objects.get().paused
    assert Schedule.objects.get().enabled
    assert Job.objects.get().cancel_requested_at is None


def test_nothing_is_added_or_edited_even_by_a_superuser(admin_client_):
    job = JobFactory()
    letter = DeadLetterFactory()
    assert admin_client_.get(url("job_add")).status_code == 403
    assert admin_client_.get(url("deadletter_add")).status_code == 403
    response = admin_client_.post(url("job_change", job.pk), {"name": "os.system", "priority": 100})
    assert response.status_code == 403
    response = admin_client_.post(url("deadletter_change", letter.pk), {"payload": "{}"})
    assert response.status_code == 403
    assert Job.objects.get().name == job.name
    assert admin_client_.post(url("job_delete", job.pk), {"post": "yes"}).status_code == 403
    assert Job.objects.exists()


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_non_staff_are_sent_to_the_login_page(who, login):
    client = (
        Client()
        if who == "anonymous"
        else login("view_deadletter", "replay_deadletter", staff=False)
    )
    letter = DeadLetterFactory()
    for target in (
        url("deadletter_changelist"),
        url("deadletter_change", letter.pk),
        url("job_changelist"),
        url("completionmarker_changelist"),
        url("dashboard"),
    ):
        response = client.get(target)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], target
    response = client.post(url("deadletter_replay", letter.pk))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert not Job.objects.exists()


def test_posts_need_the_csrf_token(login):
    client = login(superuser=True, enforce_csrf_checks=True)
    letter = DeadLetterFactory()
    job = JobFactory()

    assert client.post(url("deadletter_replay", letter.pk)).status_code == 403
    data = {"action": "replay_selected", "_selected_action": [str(letter.id)]}
    assert client.post(url("deadletter_changelist"), data).status_code == 403
    data = {"action": "cancel", "_selected_action": [str(job.id)]}
    assert client.post(url("job_changelist"), data).status_code == 403
    assert not DeadLetter.objects.get().replayed_at
    assert Job.objects.filter(pk=job.pk).exists()

    # With the token the page carries, the same POST goes through.
    page = client.get(url("deadletter_change", letter.pk))
    token = page.context["csrf_token"]
    response = client.post(url("deadletter_replay", letter.pk), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert DeadLetter.objects.get().replayed_at is not None


def test_the_dashboard_needs_a_django_jobs_permission(login):
    assert login().get(url("dashboard")).status_code == 403  # staff, but nothing of ours
    assert login("view_deadletter").get(url("dashboard")).status_code == 200
