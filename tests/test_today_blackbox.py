"""Black-box tests, from the docs only, of today's dead-parent behaviours.

Dead letters a job waits for (docs/admin.md, docs/workflows.md "Deleting a letter"),
`on_parent_dead="dead"` without `after`, replayed workflow steps, and `jobs status`.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.db import transaction

from django_jobs import InvalidJob, OnParentDead, enqueue, enqueue_on_commit, workflow
from django_jobs.control import cancel
from django_jobs.models import DeadLetter, Job
from django_jobs.testing import drain
from tests.admin_fixtures import url
from tests.test_first_run import manage

pytestmark = pytest.mark.django_db


def delete_selected(client, ids, **extra):
    data = {"action": "delete_selected", "_selected_action": [str(i) for i in ids], **extra}
    return client.post(url("deadletter_changelist"), data)


def is_protected_page(response):
    return response.status_code == 200 and bool(response.context.get("protected"))


def dead_parent(key=None):
    """A job that dies for good (FatalError) at the next drain()."""
    return enqueue("tests.fatal", key=key) if key else enqueue("tests.fatal")


def test_select_all_of_many_letters_with_one_waited_for_deletes_nothing(admin_client_):
    loose = [enqueue("tests.fatal") for _ in range(30)]
    parent = dead_parent()
    enqueue("tests.noop", after=[parent])
    drain()
    ids = [j.id for j in loose] + [parent.id]
    assert DeadLetter.objects.filter(id__in=ids).count() == 31
    for confirmed in ({}, {"post": "yes"}):
        assert is_protected_page(delete_selected(admin_client_, ids, **confirmed))
    assert DeadLetter.objects.filter(id__in=ids).count() == 31
    # Without the waited-for letter, the rest go.
    delete_selected(admin_client_, ids[:-1], post="yes")
    assert list(DeadLetter.objects.filter(id__in=ids).values_list("id", flat=True)) == [parent.id]


@pytest.mark.parametrize("key", [None, "bb-today-parent"])
def test_delete_button_refuses_a_waited_for_letter_with_or_without_key(admin_client_, key):
    parent = dead_parent(key)
    waiting = enqueue("tests.noop", after=[key or parent])
    drain()
    for data in (None, {"post": "yes"}):
        page = url("deadletter_delete", parent.id)
        response = admin_client_.get(page) if data is None else admin_client_.post(page, data)
        assert is_protected_page(response), response.status_code
    assert DeadLetter.objects.filter(id=parent.id).exists()
    assert Job.objects.filter(id=waiting.id).exists()


def test_a_cancelled_dependents_letter_protects_its_parent_unless_deleted_together(
    admin_client_,
):
    parent = dead_parent()
    child = enqueue("tests.noop", after=[parent])
    drain()
    cancel([child.id])
    assert DeadLetter.objects.filter(id=child.id).exists()
    response = delete_selected(admin_client_, [parent.id], post="yes")
    assert is_protected_page(response)
    response = admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"})
    assert is_protected_page(response)
    assert DeadLetter.objects.filter(id=parent.id).exists()
    # Together they go.
    delete_selected(admin_client_, [parent.id, child.id], post="yes")
    assert not DeadLetter.objects.filter(id__in=[parent.id, child.id]).exists()


def test_a_letter_whose_cancelled_dependents_letters_were_deleted_can_go(admin_client_):
    parent = dead_parent()
    children = [enqueue("tests.noop", after=[parent]) for _ in range(3)]
    drain()
    cancel([c.id for c in children])
    child_ids = [c.id for c in children]
    delete_selected(admin_client_, child_ids, post="yes")
    assert not DeadLetter.objects.filter(id__in=child_ids).exists()
    admin_client_.post(url("deadletter_delete", parent.id), {"post": "yes"})
    assert not DeadLetter.objects.filter(id=parent.id).exists()


def test_a_dependent_dead_with_its_parent_protects_it_unless_deleted_together(admin_client_):
    parent = dead_parent()
    child = enqueue("tests.noop", after=[parent], on_parent_dead="dead")
    grandchild = enqueue("tests.noop", after=[child], on_parent_dead="dead")
    drain()
    letters = DeadLetter.objects.filter(id__in=[parent.id, child.id, grandchild.id])
    assert letters.count() == 3
    assert is_protected_page(delete_selected(admin_client_, [parent.id], post="yes"))
    assert is_protected_page(delete_selected(admin_client_, [parent.id, child.id], post="yes"))
    assert letters.count() == 3
    delete_selected(admin_client_, [parent.id, child.id, grandchild.id], post="yes")
    assert letters.count() == 0


# 2. on_parent_dead="dead" needs parents.


@pytest.mark.parametrize("after", [None, [], ()])
@pytest.mark.parametrize("how", ["enqueue", "on_commit", "enum", "workflow"])
def test_on_parent_dead_dead_without_parents_is_refused_and_writes_nothing(how, after):
    extra = {} if after is None else {"after": after}
    before = Job.objects.count()
    with pytest.raises(InvalidJob):
        if how == "enqueue":
            enqueue("tests.noop", on_parent_dead="dead", **extra)
        elif how == "on_commit":
            with transaction.atomic():
                enqueue_on_commit("tests.noop", on_parent_dead="dead", **extra)
        elif how == "enum":
            enqueue("tests.noop", on_parent_dead=OnParentDead.DEAD, **extra)
        else:
            with workflow(name=f"bb-{how}-{after}") as w:
                w.enqueue("tests.noop", {})
                w.enqueue("tests.noop", {}, on_parent_dead="dead", **extra)
    assert Job.objects.count() == before


# 3. A replayed step stays one step.


def steps_of(client, name):
    response = client.get(url("workflow"), {"name": name})
    assert response.status_code == 200
    return response.context["steps"]


def test_a_step_replayed_twice_is_still_one_step(admin_client_):
    with workflow(name="bb-replayed") as w:
        first = w.enqueue("tests.fatal", {})
        w.enqueue("tests.noop", {}, after=[first])
    drain()
    assert len(steps_of(admin_client_, "bb-replayed")) == 2
    for _ in range(2):
        [letter] = DeadLetter.objects.filter(name="tests.fatal", replayed_at__isnull=True)
        call_command("replayjobs", "--id", str(letter.id))
        assert len(steps_of(admin_client_, "bb-replayed")) == 2
        drain()  # the replay fails again
        assert len(steps_of(admin_client_, "bb-replayed")) == 2
    listed = admin_client_.get(url("workflowstep_changelist")).context["rows"]
    [row] = [r for r in listed if "bb-replayed" in str(r)]
    assert row["dead"] == 1 and row["blocked"] == 1


# 4. jobs status names dead parents.


def test_status_names_the_dead_parent_and_how_to_replay_it(capsys):
    call_command("jobs", "status", "--json")
    assert json.loads(capsys.readouterr().out)["dead_parents"] is None
    parent = dead_parent("bb-status-parent")
    enqueue("tests.noop", after=["bb-status-parent"])
    enqueue("tests.noop", after=[parent])
    drain()
    call_command("jobs", "status")
    text = capsys.readouterr().out
    assert str(parent.id) in text and "replayjobs --id" in text
    call_command("jobs", "status", "--json")
    dead = json.loads(capsys.readouterr().out)["dead_parents"]
    assert (dead["jobs"], dead["letters"], dead["ids"]) == (2, 1, [str(parent.id)])


def test_status_names_at_most_three_dead_parents_and_ignores_cancelled_or_dead_children(capsys):
    parents = [enqueue("tests.fatal") for _ in range(5)]
    waiting = [enqueue("tests.noop", after=[p]) for p in parents]
    # Dependents that cannot be released by a replay do not count.
    dead_with_it = enqueue("tests.fatal")
    enqueue("tests.noop", after=[dead_with_it], on_parent_dead="dead")
    drain()
    call_command("jobs", "status")
    text = capsys.readouterr().out
    assert "5 blocked job(s) wait for 5 dead-lettered parent(s)" in text
    named = [p for p in parents if str(p.id) in text]
    assert 1 <= len(named) <= 3
    assert str(dead_with_it.id) not in text
    call_command("jobs", "status", "--json")
    dead = json.loads(capsys.readouterr().out)["dead_parents"]
    assert (dead["jobs"], dead["letters"]) == (5, 5)
    assert set(dead["ids"]) <= {str(p.id) for p in parents}
    cancel([j.id for j in waiting])
    call_command("jobs", "status", "--json")
    assert json.loads(capsys.readouterr().out)["dead_parents"] is None


# 5. Table commands before migrate.


def manage_on(path, *args):
    """`python -m django ARGS` on the plain SQLite project, its database file at path."""
    return manage(
        str(path), *args, extra_env={"DJANGO_SETTINGS_MODULE": "tests.plain_sqlite_settings"}
    )


def test_table_commands_before_migrate_refuse_as_runjobs_does(tmp_path):
    database = tmp_path / "new.sqlite3"
    runjobs = manage_on(database, "runjobs")
    assert runjobs.returncode == 1
    refusal = runjobs.stderr.strip()
    # worker.md quotes it as "... run python manage.py migrate first".
    assert "python manage.py migrate" in refusal and refusal.endswith("first"), refusal
    commands = (
        ["jobs", "status"],
        ["jobs", "status", "--json"],
        ["replayjobs", "--id", "0b9e1c52-5d0e-4a57-9c3a-2f1d7e6b8a41"],
        ["prunejobs"],
    )
    for command in commands:
        done = manage_on(database, *command)
        assert (done.returncode, done.stderr.strip()) == (1, refusal), command


def test_after_a_replay_dies_again_the_old_letter_goes_and_the_new_one_is_protected(
    admin_client_,
):
    parent = dead_parent()
    waiting = enqueue("tests.noop", after=[parent])
    drain()
    call_command("replayjobs", "--id", str(parent.id))
    drain()  # the replay dies too
    [again] = DeadLetter.objects.filter(name="tests.fatal", replayed_at__isnull=True)
    assert again.id != parent.id
    assert is_protected_page(delete_selected(admin_client_, [again.id], post="yes"))
    delete_selected(admin_client_, [parent.id], post="yes")  # replayed: no longer pending
    assert not DeadLetter.objects.filter(id=parent.id).exists()
    assert DeadLetter.objects.filter(id=again.id).exists()
    assert Job.objects.filter(id=waiting.id).exists()
