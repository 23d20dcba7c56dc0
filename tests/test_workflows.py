"""Workflows, the enqueue side (docs/workflows.md): after=, workflow(), dead parents, replay.

Real databases: PostgreSQL by default, most of these on SQLite too (TEST_DB=sqlite).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import (
    EnqueueResult,
    FatalError,
    IdempotencyConflict,
    InvalidJob,
    OnParentDead,
    cancel_workflow,
    control,
    enqueue,
    enqueue_on_commit,
    job,
    retention,
    workflow,
)
from django_jobs.models import (
    BLOCKED_UNTIL,
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    JobState,
    WorkflowStep,
)
from django_jobs.rows import ClaimRequest, Finished, uuid7
from django_jobs.store import JobStore
from django_jobs.testing import drain
from tests.conftest import ENGINE, POSTGRES
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[dict] = []


@job(name="tests.wf_parents")
def parents(payload, ctx):
    SEEN.append(ctx.parent_results)
    return {"step": payload}


@job(name="tests.wf_async_parents")
async def async_parents(payload, ctx):
    # A database read: an async handler makes it through sync_to_async (docs/handlers.md).
    SEEN.append(await sync_to_async(lambda: ctx.parent_results)())


@job(name="tests.wf_fatal", max_attempts=1)
def fatal(payload, ctx):
    raise FatalError("boom")


def edges_of(result):
    return {
        (d.parent_key, d.parent_id, d.on_parent_dead, d.satisfied_at is not None)
        for d in Dependency.objects.filter(job_id=result.id)
    }


def state_of(job_id):
    return Job.objects.with_state().get(id=job_id).state


# ---- enqueue(after=...) ----------------------------------------------------------------------


def test_a_job_after_a_live_parent_is_blocked_and_counted_on_the_parent():
    parent = enqueue("tests.noop")
    child = enqueue("tests.noop", after=[parent])

    row = Job.objects.get(id=child.id)
    assert (row.waiting_for, row.run_at) == (1, BLOCKED_UNTIL)
    assert Job.objects.get(id=parent.id).dependents == 1
    assert edges_of(child) == {(str(parent.id), parent.id, "wait", False)}
    assert state_of(child.id) == JobState.BLOCKED
    assert state_of(parent.id) == JobState.WAITING
    assert list(Job.objects.blocked().values_list("id", flat=True)) == [child.id]
    assert not Job.objects.scheduled().exists()
    [counts] = Job.objects.counts_by_queue()
    assert (counts["waiting"], counts["scheduled"], counts["blocked"]) == (1, 0, 1)
    # run_now (drain's run_scheduled too) moves scheduled jobs only: a blocked one stays.
    assert JobStore().run_now(Job.objects.all()) == 0
    assert Job.objects.get(id=child.id).run_at == BLOCKED_UNTIL


def test_each_form_of_a_parent_finds_it():
    keyed = enqueue("tests.noop", key="wf-parent")
    plain = enqueue("tests.noop")
    by_result = enqueue("tests.noop", after=[keyed, plain])
    by_uuid = enqueue("tests.noop", after=[plain.id])
    by_text = enqueue_on_commit("tests.noop", after=[str(plain.id), "wf-parent"])

    assert edges_of(by_result) == {
        ("wf-parent", keyed.id, "wait", False),
        (str(plain.id), plain.id, "wait", False),
    }
    assert edges_of(by_uuid) == {(str(plain.id), plain.id, "wait", False)}
    assert edges_of(by_text) == edges_of(by_result)
    assert Job.objects.get(id=keyed.id).dependents == 2
    assert Job.objects.get(id=plain.id).dependents == 3
    assert Job.objects.get(id=by_text.id).waiting_for == 2


def test_a_parent_named_twice_makes_one_edge():
    parent = enqueue("tests.noop", key="twice")
    child = enqueue("tests.noop", after=[parent, "twice", parent.id])
    assert Job.objects.get(id=child.id).waiting_for == 1
    assert Dependency.objects.filter(job_id=child.id).count() == 1


def test_a_finished_parent_counts_as_done_at_once():
    marker = MarkerFactory(key="done-key", result={"total": 3})
    plain = MarkerFactory(result=[1])
    child = enqueue("tests.wf_parents", "c", after=["done-key", plain.job_id])

    row = Job.objects.get(id=child.id)
    assert row.waiting_for == 0
    assert row.run_at < BLOCKED_UNTIL
    assert state_of(child.id) == JobState.WAITING
    assert edges_of(child) == {
        ("done-key", marker.job_id, "wait", True),
        (plain.key, plain.job_id, "wait", True),
    }
    SEEN.clear()
    drain()
    assert SEEN == [{"done-key": {"total": 3}, plain.name: [1]}]  # no key: by handler name


def test_an_async_handler_reads_parent_results_through_sync_to_async():
    MarkerFactory(key="async-parent", result={"ok": True})
    SEEN.clear()
    enqueue("tests.wf_async_parents", after=["async-parent"])
    drain()
    assert SEEN == [{"async-parent": {"ok": True}}]


def test_parent_results_is_empty_without_parents():
    SEEN.clear()
    enqueue("tests.wf_parents", "alone")
    drain()
    assert SEEN == [{}]


def test_a_missing_parent_is_refused_and_nothing_is_written():
    live = enqueue("tests.noop")
    with pytest.raises(InvalidJob, match="no such job"):
        enqueue("tests.noop", after=[live, uuid.uuid4()])
    with pytest.raises(InvalidJob, match="no such job"):
        enqueue("tests.noop", after=["no-such-key"])
    assert list(Job.objects.values_list("id", flat=True)) == [live.id]
    assert Job.objects.get(id=live.id).dependents == 0  # its count rolled back too
    assert not Dependency.objects.exists()


@pytest.mark.parametrize(
    "after",
    [[1], [None], "a-key", uuid.uuid4(), [b"bytes"], [""], ["x" * 300], 5],
    ids=["int", "none", "string", "uuid", "bytes", "empty", "long", "not-iterable"],
)
def test_after_takes_ids_results_or_keys_only(after):
    with pytest.raises(InvalidJob):
        enqueue("tests.noop", after=after)
    assert not Job.objects.exists()


@pytest.mark.parametrize("mode", ["", "Dead", "fail", None])
def test_on_parent_dead_is_wait_or_dead(mode):
    parent = enqueue("tests.noop")
    with pytest.raises(InvalidJob, match="on_parent_dead"):
        enqueue("tests.noop", after=[parent], on_parent_dead=mode)
    with pytest.raises(InvalidJob, match="on_parent_dead"):
        enqueue_on_commit("tests.noop", after=[parent], on_parent_dead=mode)
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("after", "mode"),
    [(None, "dead"), ([], "dead"), ((), OnParentDead.DEAD)],
    ids=["no-after", "empty-list", "empty-tuple-enum"],
)
def test_on_parent_dead_dead_needs_parents(after, mode):
    # Without a parent "dead" can never apply: refused at the call, before any write.
    given = {} if after is None else {"after": after}
    refused = r'on_parent_dead="dead" needs after=\[\.\.\.\]'
    with pytest.raises(InvalidJob, match=refused):
        enqueue("tests.noop", on_parent_dead=mode, **given)
    with pytest.raises(InvalidJob, match=refused):
        enqueue_on_commit("tests.noop", on_parent_dead=mode, **given)
    with pytest.raises(InvalidJob, match=refused):  # nothing left for the other commit
        enqueue_on_commit("tests.noop", on_parent_dead=mode, commit_of="other", **given)
    with pytest.raises(InvalidJob, match=refused), workflow(name="no-parents") as w:
        w.enqueue("tests.noop")  # a valid step before it is not written either
        w.enqueue("tests.noop", on_parent_dead=mode, **given)
    assert not Job.objects.exists() and not WorkflowStep.objects.exists()
    # "wait", the default, needs none; "dead" after a step of the same workflow is fine.
    enqueue("tests.noop", on_parent_dead="wait", **given)
    with workflow(name="parents") as w:
        first = w.enqueue("tests.noop")
        w.enqueue("tests.noop", after=[first], on_parent_dead=mode)
    assert Job.objects.count() == 3


def test_rolling_back_the_enqueue_leaves_no_job_and_no_edge():
    parent = enqueue("tests.noop")
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit("tests.noop", after=[parent])
        with workflow(name="rolled-back") as w:
            w.enqueue("tests.noop", after=[parent])
        raise RuntimeError("the view failed")
    assert list(Job.objects.values_list("id", flat=True)) == [parent.id]
    assert Job.objects.get(id=parent.id).dependents == 0
    assert not Dependency.objects.exists()
    assert not WorkflowStep.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_after_with_commit_of_finds_its_parents_when_the_row_is_written():
    parent = enqueue("tests.noop")
    with transaction.atomic(using="other"):
        result = enqueue_on_commit("tests.noop", after=[parent], commit_of="other")
        assert not Job.objects.filter(id=result.id).exists()
    assert Job.objects.get(id=result.id).waiting_for == 1
    assert edges_of(result) == {(str(parent.id), parent.id, "wait", False)}


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.parametrize(
    "missing", [uuid.uuid4(), "no-such-key", str(uuid.uuid4())], ids=["id", "key", "id-text"]
)
def test_after_with_commit_of_refuses_a_missing_parent_from_the_call(missing):
    # Refused inside the block, so that the other database's data rolls back with it.
    live = enqueue("tests.noop")
    after = [live, missing]
    with pytest.raises(InvalidJob, match="no such job"), transaction.atomic(using="other"):
        Audit.objects.using("other").create(label="the view's data")
        enqueue_on_commit("tests.noop", after=after, commit_of="other")
        pytest.fail("enqueue_on_commit returned: the refusal would come after the commit")
    assert not Audit.objects.using("other").exists()
    assert list(Job.objects.values_list("id", flat=True)) == [live.id]
    assert Job.objects.get(id=live.id).dependents == 0
    assert not Dependency.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_after_with_commit_of_checks_each_kind_of_parent_in_one_query_per_form():
    live = enqueue("tests.noop", key="live-key")
    plain = enqueue("tests.noop")
    done = MarkerFactory(key="done-key")
    dead = DeadLetterFactory(key="dead-key")
    dead_plain = DeadLetterFactory(key=None)
    by_id_text = MarkerFactory(key="ignored")
    key_like_an_id = str(uuid.uuid4())  # an id's text that is some job's key
    enqueue("tests.noop", key=key_like_an_id)
    after = [
        live.id, plain, done.job_id, dead.id, dead_plain.id,  # by id
        "live-key", "done-key", "dead-key",  # by key
        str(by_id_text.job_id), key_like_an_id,  # an id's text: by id, else by key
    ]  # fmt: skip
    with transaction.atomic(using="other"):
        with CaptureQueriesContext(connection) as queries:
            result = enqueue_on_commit("tests.noop", after=after, commit_of="other")
        assert not Job.objects.filter(id=result.id).exists()
    # Reads only: the ids in one statement, then the keys not found by id in one.
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 2, statements
    assert all(sql.lstrip("(").startswith("SELECT") for sql in statements), statements
    assert not any("UPDATE" in sql for sql in statements), statements  # no lock, no count
    assert Job.objects.get(id=result.id).waiting_for == 5  # 3 live jobs and 2 letters


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_after_with_commit_of_a_parent_gone_before_the_commit_raises_at_the_commit():
    # The check at the call reads; the write after the commit decides (docs/enqueue.md).
    parent = MarkerFactory(key="pruned-soon")
    with pytest.raises(InvalidJob, match="no such job"):
        with transaction.atomic(using="other"):
            Audit.objects.using("other").create(label="the view's data")
            result = enqueue_on_commit("tests.noop", after=["pruned-soon"], commit_of="other")
            CompletionMarker.objects.filter(job_id=parent.job_id).delete()
    assert Audit.objects.using("other").count() == 1  # committed: not atomic with the job
    assert not Job.objects.filter(id=result.id).exists()


@pytest.mark.parametrize("commit_of", [None, "default"])
def test_enqueue_on_commit_refuses_a_missing_parent_inside_the_jobs_transaction(commit_of):
    # Without commit_of (or naming the jobs database) the row is written at the call.
    with pytest.raises(InvalidJob, match="no such job"), transaction.atomic():
        Audit.objects.create(label="the view's data")
        enqueue_on_commit("tests.noop", after=[uuid.uuid4()], commit_of=commit_of)
        pytest.fail("enqueue_on_commit returned a job after a missing parent")
    assert not Audit.objects.exists()
    assert not Job.objects.exists()


def test_a_keyed_duplicate_with_after_registers_nothing():
    parent = enqueue("tests.noop")
    first = enqueue("tests.noop", key="dup-after")
    again = enqueue("tests.noop", key="dup-after", after=[parent])
    assert (again.id, again.duplicate) == (first.id, True)
    assert Job.objects.get(id=parent.id).dependents == 0
    assert not Dependency.objects.exists()


# ---- dead parents ----------------------------------------------------------------------------


def test_after_a_dead_parent_waits_or_dies_as_asked():
    letter = DeadLetterFactory(key="dead-parent")
    waits = enqueue("tests.noop", after=["dead-parent"])
    dies = enqueue("tests.noop", after=[letter.id], on_parent_dead="dead", key="dies")

    assert Job.objects.get(id=waits.id).waiting_for == 1
    assert state_of(waits.id) == JobState.BLOCKED
    assert not Job.objects.filter(id=dies.id).exists()
    dead = DeadLetter.objects.get(id=dies.id)
    assert (dead.reason, dead.attempts, dead.key) == (DeadReason.PARENT_DEAD, 0, "dies")
    assert "dead-parent" in dead.error
    # Its edge is written all the same: a replay of it finds what it waits for.
    assert edges_of(dies) == {("dead-parent", letter.id, "dead", False)}


def test_a_job_cannot_wait_for_a_dead_letter_of_its_own_key():
    DeadLetterFactory(key="itself")
    with pytest.raises(InvalidJob, match="its own key"):
        enqueue("tests.noop", key="itself", after=["itself"])
    with pytest.raises(InvalidJob, match="its own key"), workflow(name="self") as w:
        w.enqueue("tests.noop", key="itself", after=["itself"])
    assert not Job.objects.exists()
    assert not Dependency.objects.exists()


def test_after_a_replayed_letter_waits_for_its_replay():
    letter = DeadLetterFactory(name="tests.noop", payload="{}")
    report = control.replay(DeadLetter.objects.filter(id=letter.id))
    replay_id = report.replayed[letter.id]
    child = enqueue("tests.noop", after=[letter.id])
    assert edges_of(child) == {(str(replay_id), replay_id, "wait", False)}
    assert Job.objects.get(id=replay_id).dependents == 1


def test_dead_lettering_a_parent_buries_its_dead_dependents_recursively():
    parent = enqueue("tests.noop", key="root")
    b = enqueue("tests.noop", after=[parent], on_parent_dead="dead")
    c = enqueue("tests.noop", after=[b], on_parent_dead="dead")
    waits = enqueue("tests.noop", after=[parent])
    grandchild_waits = enqueue("tests.noop", after=[b])
    unrelated = enqueue("tests.noop")

    report = JobStore().cancel(Job.objects.filter(id=parent.id), by="ada")

    assert report.cancelled == [parent.id]
    assert DeadLetter.objects.get(id=parent.id).reason == DeadReason.CANCELLED
    for step in (b, c):
        letter = DeadLetter.objects.get(id=step.id)
        assert letter.reason == DeadReason.PARENT_DEAD
    assert "root" in DeadLetter.objects.get(id=b.id).error
    assert str(b.id) in DeadLetter.objects.get(id=c.id).error
    # "wait" dependents stay blocked, even under a buried parent.
    assert set(Job.objects.values_list("id", flat=True)) == {
        waits.id,
        grandchild_waits.id,
        unrelated.id,
    }
    assert state_of(waits.id) == state_of(grandchild_waits.id) == JobState.BLOCKED


def test_a_worker_dead_letter_buries_dead_dependents():
    parent = enqueue("tests.wf_fatal")
    child = enqueue("tests.noop", after=[parent], on_parent_dead="dead")
    drained = drain()
    assert len(drained.dead) == 1
    assert DeadLetter.objects.get(id=parent.id).reason == DeadReason.FATAL
    assert DeadLetter.objects.get(id=child.id).reason == DeadReason.PARENT_DEAD
    assert not Job.objects.exists()


def test_dead_letter_unknown_buries_dead_dependents():
    parent = JobFactory(name="tests.gone", run_at=timezone.now() - timedelta(hours=1))
    child = enqueue("tests.noop", after=[parent.id], on_parent_dead="dead")
    letters = JobStore().dead_letter_unknown(
        "tests.gone", before=timezone.now(), message="no worker knows it"
    )
    assert [letter.id for letter in letters] == [parent.id]
    assert DeadLetter.objects.get(id=child.id).reason == DeadReason.PARENT_DEAD


# ---- replay ----------------------------------------------------------------------------------


def test_replaying_a_parent_gives_its_job_the_key_its_dependents_wait_for():
    parent = enqueue("tests.wf_fatal")
    child = enqueue("tests.noop", after=[parent])
    drain()
    assert DeadLetter.objects.filter(id=parent.id).exists()
    assert state_of(child.id) == JobState.BLOCKED

    report = control.replay(DeadLetter.objects.filter(id=parent.id))
    new = Job.objects.get(id=report.replayed[parent.id])
    assert (new.key, new.dependents, new.waiting_for) == (str(parent.id), 1, 0)


def test_replaying_a_letter_without_edges_is_as_before():
    letter = DeadLetterFactory(name="tests.noop", payload="{}")
    report = control.replay(DeadLetter.objects.filter(id=letter.id))
    new = Job.objects.get(id=report.replayed[letter.id])
    assert (new.key, new.dependents, new.waiting_for) == (None, 0, 0)
    assert not Dependency.objects.exists()


def test_replaying_a_dead_step_before_its_parent_makes_it_wait_again():
    letter = DeadLetterFactory(key="p")
    with workflow(name="replayed") as w:
        step = w.enqueue("tests.noop", after=["p"], on_parent_dead="dead")
    assert DeadLetter.objects.get(id=step.id).reason == DeadReason.PARENT_DEAD

    report = control.replay(DeadLetter.objects.filter(id=step.id))
    new_id = report.replayed[step.id]
    new = Job.objects.get(id=new_id)
    assert (new.waiting_for, new.run_at) == (1, BLOCKED_UNTIL)
    assert edges_of(EnqueueResult(new_id, False, "", "")) == {("p", letter.id, "dead", False)}
    assert WorkflowStep.objects.get(job_id=new_id).workflow == "replayed"


def test_replaying_a_dead_step_after_its_parent_finished_runs_it():
    DeadLetterFactory(key="p2")
    dies = enqueue("tests.noop", after=["p2"], on_parent_dead="dead")
    MarkerFactory(key="p2")  # the parent's replay succeeded meanwhile
    report = control.replay(DeadLetter.objects.filter(id=dies.id))
    new = Job.objects.get(id=report.replayed[dies.id])
    assert new.waiting_for == 0
    assert state_of(new.id) == JobState.WAITING
    [edge] = Dependency.objects.filter(job_id=new.id)
    assert edge.satisfied_at is not None


@pytest.mark.parametrize("parent_first", [True, False], ids=["parent first", "child first"])
def test_a_dead_parent_and_its_dead_step_replayed_together_run_in_order(parent_first):
    # One replay batch holds both letters, in id order either way round.
    low, high = sorted([uuid.UUID(int=uuid7().int), uuid.UUID(int=uuid7().int)])
    parent_id, child_id = (low, high) if parent_first else (high, low)
    DeadLetterFactory(id=parent_id, name="tests.wf_parents", payload='"parent"', key="both")
    DeadLetterFactory(
        id=child_id, name="tests.wf_parents", payload='"child"', reason=DeadReason.PARENT_DEAD
    )
    Dependency.objects.create(
        job_id=child_id,
        parent_key="both",
        parent_id=parent_id,
        on_parent_dead=OnParentDead.DEAD,
        created_at=timezone.now(),
    )
    waiter = enqueue("tests.wf_parents", "waiter", after=["both"])  # blocked on the letter

    report = control.replay(DeadLetter.objects.filter(id__in=[parent_id, child_id]))

    assert set(report.replayed) == {parent_id, child_id}
    parent = Job.objects.get(id=report.replayed[parent_id])
    child = Job.objects.get(id=report.replayed[child_id])
    # Its unsatisfied edges: the waiter's, the child letter's and that edge's copy.
    assert parent.key == "both" and parent.dependents == 3
    assert (child.waiting_for, child.run_at) == (1, BLOCKED_UNTIL)
    SEEN.clear()
    drain()
    assert not Job.objects.exists()
    assert SEEN[0] == {}  # the parent first, then the two that waited for it
    assert SEEN[1:] == [{"both": {"step": "parent"}}] * 2
    assert CompletionMarker.objects.filter(job_id__in=[child.id, waiter.id]).count() == 2


# ---- retention -------------------------------------------------------------------------------


def test_a_dead_letter_blocked_jobs_wait_for_is_kept_until_replayed():
    old = timezone.now() - timedelta(days=60)
    waited = DeadLetterFactory(key="waited", dead_at=old)
    waited_by_id = DeadLetterFactory(dead_at=old)
    DeadLetterFactory(dead_at=old)  # alone: nobody waits for it
    released = DeadLetterFactory(key="released", dead_at=old)  # its dependent was cancelled
    enqueue("tests.noop", after=["waited", waited_by_id.id])
    later = enqueue("tests.noop", after=["released"])
    # Cancelled, its dependent is a pending letter that still waits (a replay of it
    # waits again): the letter it names stays too.
    JobStore().cancel(Job.objects.filter(id=later.id))

    assert retention.count_prunable().dead_letters == 1  # alone
    retention.prune()
    assert set(DeadLetter.objects.values_list("id", flat=True)) == {
        waited.id,
        waited_by_id.id,
        released.id,
        later.id,  # young
    }
    control.replay(DeadLetter.objects.filter(id=later.id))  # the replay waits for "released" now
    DeadLetter.objects.update(dead_at=old)
    assert retention.count_prunable().dead_letters == 1  # later's replayed letter
    retention.prune()
    assert set(DeadLetter.objects.values_list("id", flat=True)) == {
        waited.id,
        waited_by_id.id,
        released.id,
    }


def test_a_steps_edges_and_row_go_with_its_last_record():
    with workflow(name="pruned") as w:
        a = w.enqueue("tests.noop")
        b = w.enqueue("tests.noop", after=[a])
    drain()
    assert not Job.objects.exists()
    assert Dependency.objects.count() == 1
    keep = DeadLetterFactory()  # another job's records stay
    CompletionMarker.objects.update(completed_at=timezone.now() - timedelta(days=30))
    [marker_b] = CompletionMarker.objects.filter(job_id=b.id)
    # b's marker kept young: its edge and row stay while a's go.
    CompletionMarker.objects.filter(job_id=b.id).update(completed_at=timezone.now())

    result = retention.prune()

    assert result.markers == 1
    assert list(CompletionMarker.objects.values_list("job_id", flat=True)) == [marker_b.job_id]
    assert list(WorkflowStep.objects.values_list("job_id", flat=True)) == [b.id]
    assert list(Dependency.objects.values_list("job_id", flat=True)) == [b.id]
    CompletionMarker.objects.update(completed_at=timezone.now() - timedelta(days=30))
    retention.prune()
    assert not WorkflowStep.objects.exists()
    assert not Dependency.objects.exists()
    assert DeadLetter.objects.filter(id=keep.id).exists()


# ---- workflow() ------------------------------------------------------------------------------


def test_a_workflow_writes_its_steps_at_exit():
    with workflow(name="order-42") as w:
        a = w.enqueue("tests.noop", {"step": "charge"})
        b = w.enqueue("tests.noop", {"step": "reserve"}, after=[a])
        c = w.enqueue("tests.noop", {"step": "confirm"}, after=[a.id], on_parent_dead="dead")
        d = w.enqueue("tests.noop", {"step": "ship"}, after=[b, c], priority=5, queue="emails")
        assert not Job.objects.exists()  # nothing before the block ends
        assert a.duplicate is False and a.enqueued_at is None

    rows = {j.id: j for j in Job.objects.all()}
    assert [(rows[r.id].waiting_for, rows[r.id].dependents) for r in (a, b, c, d)] == [
        (0, 2),
        (1, 1),
        (1, 1),
        (2, 0),
    ]
    assert rows[a.id].run_at < BLOCKED_UNTIL
    assert rows[d.id].run_at == BLOCKED_UNTIL
    assert (rows[d.id].priority, rows[d.id].queue) == (5, "emails")
    assert edges_of(c) == {(str(a.id), a.id, "dead", False)}
    assert edges_of(d) == {(str(b.id), b.id, "wait", False), (str(c.id), c.id, "wait", False)}
    steps = WorkflowStep.objects.filter(workflow="order-42")
    assert {s.job_id for s in steps} == {a.id, b.id, c.id, d.id}
    assert [r.id for r in w.results] == [a.id, b.id, c.id, d.id]
    assert all(r.enqueued_at is not None for r in w.results)


def test_a_big_fan_out_and_fan_in_takes_a_few_statements():
    with CaptureQueriesContext(connection) as queries, workflow(name="fan") as w:
        root = w.enqueue("tests.noop", {"n": -1})
        middle = [w.enqueue("tests.noop", {"n": n}, after=[root]) for n in range(10_000)]
        last = w.enqueue("tests.noop", {"n": "end"}, after=middle)
    # No statement per step: a handful on PostgreSQL (COPY), batches of rows elsewhere.
    assert len(queries) <= (15 if POSTGRES else 100), [q["sql"][:60] for q in queries]
    assert Job.objects.count() == 10_002
    assert Dependency.objects.count() == 20_000
    assert WorkflowStep.objects.filter(workflow="fan").count() == 10_002
    assert Job.objects.get(id=root.id).dependents == 10_000
    assert Job.objects.get(id=last.id).waiting_for == 10_000
    assert Job.objects.filter(waiting_for=1, dependents=1).count() == 10_000


def test_names_and_keys_with_backslashes_are_written_as_given():
    MarkerFactory(key="done\\N")
    with workflow(name="back\\slash \\N") as w:
        a = w.enqueue("tests.noop", key="a\\tb")
        w.enqueue("tests.noop", after=["done\\N", a])
    assert set(WorkflowStep.objects.values_list("workflow", "key")) == {
        ("back\\slash \\N", "a\\tb"),
        ("back\\slash \\N", None),
    }
    assert set(Dependency.objects.values_list("parent_key", flat=True)) == {"done\\N", "a\\tb"}


def test_an_exception_in_the_block_writes_nothing():
    with pytest.raises(ValueError), workflow(name="broken") as w:
        w.enqueue("tests.noop")
        raise ValueError("no")
    assert not Job.objects.exists()
    assert not WorkflowStep.objects.exists()
    with pytest.raises(InvalidJob, match="written already"):
        w.enqueue("tests.noop")


def test_an_invalid_step_raises_at_once():
    with workflow(name="checked") as w:
        with pytest.raises(InvalidJob):
            w.enqueue("tests.noop", after=[42])
        with pytest.raises(InvalidJob):
            w.enqueue("tests.noop", on_parent_dead="maybe")
        with pytest.raises(InvalidJob):
            w.enqueue("tests.noop", priority=1000)
        ok = w.enqueue("tests.noop")
    assert list(Job.objects.values_list("id", flat=True)) == [ok.id]


def test_a_missing_outside_parent_writes_no_step():
    with pytest.raises(InvalidJob, match="no such job"), workflow(name="missing") as w:
        w.enqueue("tests.noop")
        w.enqueue("tests.noop", after=["nobody"])
    assert not Job.objects.exists()
    assert not WorkflowStep.objects.exists()


@pytest.mark.parametrize("name", ["", " x", "a\x00b", "x" * 256, None, 5])
def test_a_workflow_name_is_printable_text(name):
    with pytest.raises(InvalidJob):
        workflow(name=name)
    with pytest.raises(InvalidJob):
        cancel_workflow(name)


def test_steps_may_wait_for_jobs_outside_the_workflow():
    outside = enqueue("tests.noop", key="outside")
    MarkerFactory(key="finished")
    with workflow(name="mixed") as w:
        a = w.enqueue("tests.noop", after=["outside", "finished"])
        b = w.enqueue("tests.noop", after=["outside", a])
    assert Job.objects.get(id=outside.id).dependents == 2
    assert Job.objects.get(id=a.id).waiting_for == 1
    assert Job.objects.get(id=b.id).waiting_for == 2


def test_a_keyed_step_whose_key_is_held_makes_no_row():
    holder = enqueue("tests.noop", key="held")
    MarkerFactory(key="finished-step", name="tests.noop")
    with workflow(name="keyed") as w:
        a = w.enqueue("tests.noop", key="held")
        b = w.enqueue("tests.noop", after=[a])
        done = w.enqueue("tests.noop", key="finished-step")
        c = w.enqueue("tests.noop", after=[done], key="c")
        same = w.enqueue("tests.noop", key="c")
    assert (same.id, same.duplicate) == (c.id, True)
    assert [(r.id, r.duplicate) for r in w.results] == [
        (holder.id, True),
        (b.id, False),
        (CompletionMarker.objects.get(key="finished-step").job_id, True),
        (c.id, False),
    ]
    assert not Job.objects.filter(id__in=[a.id, done.id]).exists()
    assert Job.objects.get(id=holder.id).dependents == 1
    assert edges_of(b) == {("held", holder.id, "wait", False)}
    assert Job.objects.get(id=c.id).waiting_for == 0
    assert set(WorkflowStep.objects.values_list("job_id", flat=True)) == {b.id, c.id}
    with pytest.raises(IdempotencyConflict), workflow(name="conflict") as w:
        w.enqueue("tests.noop", {"x": 1}, key="k")
        w.enqueue("tests.noop", {"x": 2}, key="k")


def test_a_step_under_a_dead_step_of_its_workflow_dies_too():
    DeadLetterFactory(key="gone")
    with workflow(name="doomed") as w:
        a = w.enqueue("tests.noop", after=["gone"], on_parent_dead="dead")
        b = w.enqueue("tests.noop", after=[a], on_parent_dead="dead")
        c = w.enqueue("tests.noop", after=[a])
    assert DeadLetter.objects.get(id=a.id).reason == DeadReason.PARENT_DEAD
    assert DeadLetter.objects.get(id=b.id).reason == DeadReason.PARENT_DEAD
    assert list(Job.objects.values_list("id", flat=True)) == [c.id]
    assert Job.objects.get(id=c.id).waiting_for == 1
    assert WorkflowStep.objects.filter(workflow="doomed").count() == 3


def test_cancel_workflow_cancels_its_live_steps():
    other, a, b, running = _workflow_to_cancel()
    result = cancel_workflow("to-cancel", by="ada")
    assert (result.cancelled, result.requested) == (2, 1)
    assert DeadLetter.objects.get(id=a.id).reason == DeadReason.CANCELLED
    assert DeadLetter.objects.get(id=b.id).reason in (DeadReason.CANCELLED, DeadReason.PARENT_DEAD)
    assert set(Job.objects.values_list("id", flat=True)) == {other.id, running.id}
    assert Job.objects.get(id=running.id).cancel_requested_at is not None
    assert cancel_workflow("no-such-workflow").cancelled == 0


def _workflow_to_cancel():
    """A workflow of two waiting steps (one blocked) and a running one, and a job outside it."""
    other = enqueue("tests.noop")
    with workflow(name="to-cancel") as w:
        a = w.enqueue("tests.noop")
        b = w.enqueue("tests.noop", after=[a], on_parent_dead="dead")
    running = JobFactory(leased=True)
    WorkflowStep.objects.create(
        job_id=running.id, workflow="to-cancel", name="tests.noop", created_at=timezone.now()
    )
    return other, a, b, running


def test_jobs_cancel_workflow_command_cancels_its_live_steps(capsys):
    other, a, b, running = _workflow_to_cancel()
    call_command("jobs", "cancel", "--workflow", "to-cancel")
    out, err = capsys.readouterr()
    assert out == (
        "workflow 'to-cancel': cancelled 2 job(s) (1 waiting, 1 blocked); asked the workers "
        "of 1 running "
        "job(s) to stop them\n"
    )
    assert err == ""
    letter = DeadLetter.objects.get(id=a.id)
    assert letter.reason == DeadReason.CANCELLED
    assert "manage.py jobs" in letter.error
    assert DeadLetter.objects.filter(id=b.id).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {other.id, running.id}
    assert Job.objects.get(id=running.id).cancel_requested_at is not None

    # Again: nothing live is left (the running step is already asked), and it says so.
    call_command("jobs", "cancel", "--workflow", "to-cancel")
    out, err = capsys.readouterr()
    assert out.startswith("workflow 'to-cancel': cancelled 0 job(s); ")
    assert "asked the workers of 0 running job(s)" in out
    assert err == (
        "workflow 'to-cancel' has no live step (all finished, dead or already cancelling)\n"
    )


def test_jobs_cancel_workflow_command_refuses_an_unknown_name(capsys):
    other, *_ = _workflow_to_cancel()
    with pytest.raises(CommandError, match="^no workflow named 'to-cancel-2'$") as error:
        call_command("jobs", "cancel", "--workflow", "to-cancel-2")
    assert error.value.returncode == 1
    assert capsys.readouterr().out == ""
    assert Job.objects.count() == 4 and not DeadLetter.objects.exists()
    assert Job.objects.filter(id=other.id).exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workflow", "to-cancel", "ID"], "give JOB_IDs or --workflow NAME, not both"),
        ([], "say what to cancel: JOB_ID ... or --workflow NAME"),
    ],
)
def test_jobs_cancel_wants_job_ids_or_a_workflow(argv, message):
    other, *_ = _workflow_to_cancel()
    argv = [str(other.id) if arg == "ID" else arg for arg in argv]
    with pytest.raises(CommandError, match=message) as error:
        call_command("jobs", "cancel", *argv)
    assert error.value.returncode == 2  # as argparse's errors: the command line is wrong
    assert Job.objects.count() == 4 and not DeadLetter.objects.exists()


def test_on_parent_dead_is_exported():
    assert OnParentDead.DEAD == "dead"
    assert OnParentDead.WAIT == "wait"


# ---- with the settle side: parents' completion releases their dependents ---------------------


def test_a_diamond_runs_in_order_through_drain():
    SEEN.clear()
    with workflow(name="diamond") as w:
        a = w.enqueue("tests.wf_parents", "a", key="diamond-a")
        b = w.enqueue("tests.wf_parents", "b", after=[a])
        c = w.enqueue("tests.wf_parents", "c", after=[a])
        w.enqueue("tests.wf_parents", "d", after=[b, c])
    drain()
    assert not Job.objects.exists()
    assert SEEN[0] == {}
    assert {"diamond-a": {"step": "a"}} in SEEN
    # b and c: one handler, no keys: numbered in the order of after=.
    assert SEEN[-1] == {"tests.wf_parents[0]": {"step": "b"}, "tests.wf_parents[1]": {"step": "c"}}


def test_replaying_a_parent_releases_its_waiting_dependents():
    parent = enqueue("tests.wf_fatal")
    child = enqueue("tests.wf_parents", "child", after=[parent])
    drain()
    assert state_of(child.id) == JobState.BLOCKED
    letter = DeadLetter.objects.get(id=parent.id)
    letter.name = "tests.wf_parents"  # the fix is deployed: the replay succeeds
    letter.payload = '"parent"'
    letter.save()
    control.replay(DeadLetter.objects.filter(id=parent.id))
    SEEN.clear()
    drain()
    assert not Job.objects.exists()
    # A replayed parent without a key: by its handler's name, as before it died.
    assert SEEN[-1] == {"tests.wf_parents": {"step": "parent"}}


@pytest.mark.skipif(ENGINE == "sqlite", reason="not on SQLite: one writer at a time, no race")
def test_a_dependent_enqueued_while_its_parent_settles_is_never_stuck():
    """Enqueue a dependent in one thread while the parent is completed in another, many times."""
    stuck = []
    for round_ in range(30):
        parent = enqueue("tests.noop")
        token = f"w:1:a#{round_}"
        [claimed] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token=token, lease=30)
        )
        barrier = threading.Barrier(2)
        child: list[EnqueueResult] = []

        def add_child(parent=parent, barrier=barrier, child=child):
            try:
                with transaction.atomic():
                    barrier.wait()
                    child.append(enqueue("tests.noop", after=[parent]))
            finally:
                close_old_connections()

        def settle(claimed=claimed, barrier=barrier):
            try:
                barrier.wait()
                JobStore().complete([Finished(claimed.id, claimed.token, None, claimed.dependents)])
            finally:
                close_old_connections()

        threads = [threading.Thread(target=add_child), threading.Thread(target=settle)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # complete() settled it, past the fence when a dependent registered after the claim.
        assert CompletionMarker.objects.filter(job_id=parent.id).exists()
        row = Job.objects.get(id=child[0].id)
        if row.waiting_for != 0 or row.run_at == BLOCKED_UNTIL:
            stuck.append(round_)
        Job.objects.all().delete()
    assert stuck == []


@pytest.mark.postgres  # row locks seen from a third connection
def test_parents_are_locked_in_one_order_whatever_order_after_names_them():
    # Two enqueues naming the same live parents in opposite orders would deadlock if
    # each locked them as named. Hold A from another connection: an enqueue naming
    # [B, A] must wait on A before it touches B, so B stays free meanwhile.
    a, b = sorted([enqueue("tests.noop").id, enqueue("tests.noop").id])
    holding, release = threading.Event(), threading.Event()

    def hold_a():
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id=a))
                holding.set()
                release.wait(30)
        finally:
            close_old_connections()

    def enqueue_after_b_then_a():
        try:
            enqueue("tests.noop", after=[b, a])
        finally:
            close_old_connections()

    holder = threading.Thread(target=hold_a)
    holder.start()
    assert holding.wait(30)
    enqueuer = threading.Thread(target=enqueue_after_b_then_a)
    enqueuer.start()
    try:
        with connection.cursor() as cursor:
            # Wait until the enqueue is blocked on A's lock (pg_locks: a lock not granted).
            for _ in range(300):
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if cursor.fetchone()[0]:
                    break
                threading.Event().wait(0.1)
            else:
                pytest.fail("the enqueue never waited for A")
            with transaction.atomic():
                cursor.execute(
                    "SELECT id FROM django_jobs_job WHERE id = %s FOR UPDATE NOWAIT", [b]
                )
                assert cursor.fetchone() is not None  # B was not locked before A
    finally:
        release.set()
        holder.join(30)
        enqueuer.join(30)
    assert Job.objects.get(id=a).dependents == 1
    assert Job.objects.get(id=b).dependents == 1
