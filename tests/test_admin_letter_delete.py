"""The dead-letter admin refuses to delete a pending letter that live jobs wait for."""

from __future__ import annotations

from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobs import control, enqueue
from django_jobs.admin.deadletters import WAITED_FOR_LINES
from django_jobs.models import DeadLetter, Dependency, Job, JobState
from django_jobs.store import JobStore
from django_jobs.testing import drain
from tests.admin_fixtures import url
from tests.factories import DeadLetterFactory

pytestmark = pytest.mark.django_db


def dead_parent_and_child(**child):
    """A parent that died for real (tests.fatal, run by drain), and a job waiting for it."""
    parent = enqueue("tests.fatal")
    waiting = enqueue("tests.noop", after=[parent], **child)
    drain()
    assert DeadLetter.objects.filter(id=parent.id, replayed_at__isnull=True).exists()
    return parent, waiting


def delete_selected(client, ids, **extra):
    data = {"action": "delete_selected", "_selected_action": [str(i) for i in ids], **extra}
    return client.post(url("deadletter_changelist"), data)


def refused(response):
    """The lines of Django's "protected related objects" page, or None for another page."""
    if response.status_code != 200 or not response.context.get("protected"):
        return None
    return [unescape(str(line)) for line in response.context["protected"]]


def test_bulk_delete_of_a_letter_a_blocked_job_waits_for_is_refused(admin_client_):
    parent, waiting = dead_parent_and_child()
    alone = DeadLetterFactory()

    for confirmed in ({}, {"post": "yes"}):
        response = delete_selected(admin_client_, [parent.id, alone.id], **confirmed)
        [line] = refused(response)
        assert "1 job waits for it (its page lists it). Replay it, or cancel that job first" in line
        assert "manage.py jobs cancel" in line
        assert f"/admin/django_jobs/deadletter/{parent.id}/change/" in line
        assert "Cannot delete" in response.text  # Django's own words: nothing is deleted
    assert DeadLetter.objects.filter(id__in=[parent.id, alone.id]).count() == 2
    assert Job.objects.with_state().get(id=waiting.id).state == JobState.BLOCKED


def test_delete_view_of_a_letter_jobs_wait_for_is_refused(admin_client_):
    parent, _ = dead_parent_and_child(on_parent_dead="wait")
    enqueue("tests.noop", after=[parent])  # a second job waiting for it

    page = admin_client_.get(url("deadletter_delete", parent.id))
    assert refused(page) and "2 jobs wait for it" in refused(page)[0]
    response = admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"})
    [line] = refused(response)
    assert "2 jobs wait for it (its page lists them). Replay it, or cancel those jobs first" in line
    assert DeadLetter.objects.filter(id=parent.id).exists()


def test_a_letter_nobody_waits_for_deletes(admin_client_):
    keyed, keyless = DeadLetterFactory(key="nobody-waits"), DeadLetterFactory()
    response = delete_selected(admin_client_, [keyed.id], post="yes")
    assert response.status_code == 302
    response = admin_client_.post(url("deadletter_delete", keyless.id), {"post": "yes"})
    assert response.status_code == 302
    assert not DeadLetter.objects.exists()


def test_a_letter_a_cancelled_dependent_waits_for_deletes_only_with_that_letter(admin_client_):
    parent, waiting = dead_parent_and_child()
    JobStore().cancel(Job.objects.filter(id=waiting.id), by="ops")

    # Its dependent is a letter now (cancelled), which would wait again if replayed.
    [line] = refused(admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"}))
    assert "1 dead letter of a job that waited for it would wait again if replayed" in line
    assert "job waits" not in line
    assert DeadLetter.objects.filter(id=parent.id).exists()
    # Deleted together, neither is left to wait or be waited for.
    response = delete_selected(admin_client_, [parent.id, waiting.id], post="yes")
    assert response.status_code == 302
    assert not DeadLetter.objects.filter(id__in=[parent.id, waiting.id]).exists()


def test_a_letter_deletes_once_its_dependents_letter_is_gone(admin_client_):
    parent, waiting = dead_parent_and_child(on_parent_dead="dead")
    # The dependent died with its parent (parent_dead): its letter waits for the parent.
    assert DeadLetter.objects.get(id=waiting.id).reason == "parent_dead"
    assert refused(admin_client_.get(url("deadletter_delete", parent.id)))
    response = admin_client_.post(url("deadletter_delete", waiting.id), {"post": "yes"})
    assert response.status_code == 302
    response = admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"})
    assert response.status_code == 302
    assert not DeadLetter.objects.exists()


def test_a_letter_deletes_once_its_replay_completed(admin_client_):
    parent = enqueue("tests.noop")
    child = enqueue("tests.noop", after=[parent])
    JobStore().cancel(
        Job.objects.filter(id=parent.id), by="ops"
    )  # the parent dies: a pending letter
    assert refused(admin_client_.get(url("deadletter_delete", parent.id)))

    control.replay(DeadLetter.objects.filter(id=parent.id))
    drain()
    assert not Job.objects.filter(id=child.id).exists()  # released, and run
    assert not Dependency.objects.filter(job_id=child.id, satisfied_at__isnull=True).exists()
    response = delete_selected(admin_client_, [parent.id], post="yes")
    assert response.status_code == 302
    assert not DeadLetter.objects.filter(id=parent.id).exists()


def test_the_letter_of_a_replay_that_died_again_is_refused_in_its_turn(admin_client_):
    parent, waiting = dead_parent_and_child()
    replayed = control.replay(DeadLetter.objects.filter(id=parent.id)).replayed[parent.id]
    drain()
    # Dead again under its own id, keyed by the parent's id: the job still waits for that key.
    assert DeadLetter.objects.get(id=replayed).key == str(parent.id)
    assert "1 job waits for it" in refused(admin_client_.get(url("deadletter_delete", replayed)))[0]
    # The replayed letter is history: nothing waits for it any more.
    response = admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"})
    assert response.status_code == 302
    assert Job.objects.with_state().get(id=waiting.id).state == JobState.BLOCKED


def test_many_letters_take_the_same_queries_and_list_the_first_ones(admin_client_):
    def letters(n, prefix):
        keys = [f"{prefix}-{i}" for i in range(n)]
        made = [DeadLetterFactory(key=key) for key in keys]
        enqueue("tests.noop", after=keys)  # one job waiting for each of them
        return [letter.id for letter in made]

    few, many = letters(2, "few"), letters(WAITED_FOR_LINES + 5, "many")
    with CaptureQueriesContext(connection) as for_few:
        assert len(refused(delete_selected(admin_client_, few))) == 2
    with CaptureQueriesContext(connection) as for_many:
        lines = refused(delete_selected(admin_client_, many))
    assert len(lines) == WAITED_FOR_LINES + 1
    assert lines[-1] == "… and 5 more dead letters that jobs wait for."
    # Only the count of the letters past the listed ones is one more query.
    assert len(for_many.captured_queries) == len(for_few.captured_queries) + 1
    assert DeadLetter.objects.count() == len(few) + len(many)
