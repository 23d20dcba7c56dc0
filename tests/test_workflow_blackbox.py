"""Workflows (issue 15) checked from the outside: the public API, commands, admin, workers.

Written from README.md and docs/ alone, as an independent checker would: every
expectation below quotes what docs/workflows.md (or tasks.md, admin.md,
operations.md) promises. Handlers: tests/testapp/blackbox_jobs.py.
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from datetime import timedelta
from io import StringIO
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone
from django.utils.html import escape

from django_jobs import (
    EnqueueResult,
    IdempotencyConflict,
    InvalidJob,
    OnParentDead,
    cancel_workflow,
    control,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    workflow,
)
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Dependency,
    Job,
    WorkerBeat,
    WorkflowStep,
)
from django_jobs.testing import drain
from tests.conftest import wait_for
from tests.testapp.models import Audit

STEP = "tests.bb.step"
FRAGILE = "tests.bb.fragile"


def ran(label):
    """How many times the step labelled `label` started."""
    return Audit.objects.filter(label__startswith=f"bb|{label}|").count()


def is_blocked(result):
    return Job.objects.blocked().filter(id=result.id).exists()


def marker_of(result):
    return CompletionMarker.objects.get(job_id=result.id)


def start_workers(worker_process, count, *args):
    """Start runjobs processes and wait for their heartbeats (their signal handlers are set)."""
    workers = [worker_process(*args) for _ in range(count)]
    wait_for(lambda: WorkerBeat.objects.count() >= count, message="the workers' heartbeats")
    return workers


def stop_workers(workers):
    """SIGTERM each worker, then wait: each must drain and exit cleanly."""
    for proc in workers:
        proc.signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait() == 0, proc.output()


def nothing_written():
    return not (
        Job.objects.exists() or Dependency.objects.exists() or WorkflowStep.objects.exists()
    )


# ---- after=: what it takes, what it refuses ----------------------------------


@pytest.mark.django_db
def test_after_refuses_a_parent_that_does_not_exist_and_writes_nothing():
    for missing in (uuid.uuid4(), str(uuid.uuid4()), "no-such-key"):
        with pytest.raises(InvalidJob):
            enqueue(STEP, {"label": "orphan"}, after=[missing])
        assert nothing_written()
    # One good parent among them does not make the bad one acceptable.
    parent = enqueue(STEP, {"label": "p"})
    with pytest.raises(InvalidJob):
        enqueue(STEP, {"label": "c"}, after=[parent, uuid.uuid4()])
    assert list(Job.objects.values_list("id", flat=True)) == [parent.id]
    assert not Dependency.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["WAIT", "die", "", None, 1])
def test_on_parent_dead_refuses_anything_but_wait_and_dead(value):
    parent = enqueue(STEP, {"label": "p"})
    with pytest.raises(InvalidJob):
        enqueue(STEP, {"label": "c"}, after=[parent], on_parent_dead=value)
    assert Job.objects.count() == 1 and not Dependency.objects.exists()


@pytest.mark.django_db
def test_on_parent_dead_takes_the_enum_and_its_text():
    parent = enqueue(STEP, {"label": "p"})
    a = enqueue(STEP, {"label": "a"}, after=[parent], on_parent_dead=OnParentDead.DEAD)
    b = enqueue(STEP, {"label": "b"}, after=[parent], on_parent_dead="dead")
    c = enqueue(STEP, {"label": "c"}, after=[parent], on_parent_dead=OnParentDead.WAIT)
    assert all(is_blocked(r) for r in (a, b, c))


@pytest.mark.django_db
def test_after_empty_is_no_dependency():
    result = enqueue(STEP, {"label": "free"}, after=[])
    assert not is_blocked(result)
    assert Job.objects.waiting().filter(id=result.id).exists()
    drain()
    assert ran("free") == 1
    assert marker_of(result).result == {"label": "free", "saw": {}}


@pytest.mark.django_db
def test_one_parent_named_many_ways_is_waited_for_once():
    """The same parent as an EnqueueResult, a UUID, its text and its key: one parent."""
    parent = enqueue(STEP, {"label": "p"}, key="the-parent")
    child = enqueue(
        STEP,
        {"label": "c", "parents": ["the-parent"]},
        after=[parent, parent.id, str(parent.id), "the-parent", parent],
    )
    assert is_blocked(child)
    drain()
    assert ran("p") == 1
    assert ran("c") == 1
    assert Audit.objects.filter(label="bb|c|0").exists()  # it started after the marker
    assert marker_of(child).result["saw"] == {"the-parent": {"label": "p", "saw": {}}}
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_parent_results_are_keyed_by_dedupe_key_or_handler_name():
    enqueue(STEP, {"label": "keyed"}, key="k-1")
    plain = enqueue(STEP, {"label": "plain"})
    child = enqueue(STEP, {"label": "child"}, after=["k-1", str(plain.id)])
    drain()
    saw = marker_of(child).result["saw"]
    assert saw == {
        "k-1": {"label": "keyed", "saw": {}},
        STEP: {"label": "plain", "saw": {}},
    }


@pytest.mark.django_db
def test_parents_of_one_handler_without_keys_are_numbered_in_the_order_of_after():
    first = enqueue(STEP, {"label": "first"})
    second = enqueue(STEP, {"label": "second"})
    enqueue(STEP, {"label": "keyed"}, key="k-2")
    child = enqueue(STEP, {"label": "child"}, after=[second, "k-2", first])
    drain()
    assert marker_of(child).result["saw"] == {
        f"{STEP}[0]": {"label": "second", "saw": {}},
        "k-2": {"label": "keyed", "saw": {}},
        f"{STEP}[1]": {"label": "first", "saw": {}},
    }


@pytest.mark.django_db
def test_a_finished_parent_counts_as_done_at_once():
    parent = enqueue(STEP, {"label": "early"}, key="early")
    drain()
    assert CompletionMarker.objects.filter(key="early").exists()
    by_key = enqueue(STEP, {"label": "by-key"}, after=["early"])
    by_result = enqueue(STEP, {"label": "by-result"}, after=[parent])
    assert not is_blocked(by_key) and not is_blocked(by_result)
    assert Job.objects.waiting().filter(id__in=[by_key.id, by_result.id]).count() == 2
    drain()
    assert marker_of(by_key).result["saw"] == {"early": {"label": "early", "saw": {}}}


@pytest.mark.django_db
def test_a_parent_that_is_itself_blocked_releases_down_the_chain():
    a = enqueue(STEP, {"label": "a"})
    b = enqueue(STEP, {"label": "b", "parents": [str(a.id)]}, after=[a])
    c = enqueue(STEP, {"label": "c", "parents": [str(b.id)]}, after=[b])
    assert is_blocked(b) and is_blocked(c)
    drain()
    assert [ran(x) for x in "abc"] == [1, 1, 1]
    assert Audit.objects.filter(label__in=["bb|b|0", "bb|c|0"]).count() == 2
    assert list(marker_of(c).result["saw"]) == [STEP]  # no key: by its handler's name


@pytest.mark.django_db(transaction=True)
def test_two_thousand_parents_fan_in():
    parents = enqueue_many(STEP, [{"label": f"p{i}"} for i in range(2000)])
    # Every form at once: results, UUIDs and id texts (their keys).
    named = [[p, p.id, str(p.id)][i % 3] for i, p in enumerate(parents)]
    child = enqueue(STEP, {"label": "join"}, after=named)
    assert Job.objects.get(id=child.id).waiting_for == 2000
    # A worker, not drain(): in one never-committed test transaction PostgreSQL
    # keeps every version of the fan-in row its 2,000 releases write.
    call_command("runjobs", "--burst")
    assert ran("join") == 1
    saw = marker_of(child).result["saw"]
    assert len(saw) == 2000
    # One handler, no keys: numbered in the order of after=.
    assert [saw[f"{STEP}[{i}]"]["label"] for i in range(2000)] == [f"p{i}" for i in range(2000)]


@pytest.mark.django_db
def test_enqueue_on_commit_takes_after_too():
    parent = enqueue_on_commit(STEP, {"label": "p"})
    child = enqueue_on_commit(STEP, {"label": "c"}, after=[parent])
    assert isinstance(child, EnqueueResult) and is_blocked(child)
    drain()
    assert ran("c") == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "after", ["abc", [None], [1], [""], ["x" * 300], ["a\x00"], [" a"], [object()]]
)
def test_after_refuses_what_names_no_job(after):
    """One string is not a list of its letters; junk items are refused, nothing written."""
    for key in ("abc", "a", "b", "c"):
        enqueue(STEP, {"label": key}, key=key)
    with pytest.raises(InvalidJob):
        enqueue(STEP, {"label": "child"}, after=after)
    assert Job.objects.count() == 4 and not Dependency.objects.exists()
    assert set(Job.objects.values_list("dependents", flat=True)) == {0}


@pytest.mark.django_db
def test_cycles_cannot_be_expressed_in_a_workflow():
    """A step can name only what exists when it is written: itself or a later step is refused."""
    with pytest.raises(InvalidJob), workflow(name="self") as w:
        w.enqueue(STEP, {"label": "s"}, key="self", after=["self"])
    with pytest.raises(InvalidJob), workflow(name="loop") as w:
        w.enqueue(STEP, {"label": "x"}, key="x", after=["y"])
        w.enqueue(STEP, {"label": "y"}, key="y", after=["x"])
    with pytest.raises(InvalidJob):
        enqueue(STEP, {"label": "me"}, key="me", after=["me"])
    assert nothing_written()


@pytest.mark.django_db
def test_a_finished_keyed_parent_named_by_its_id():
    parent = enqueue(STEP, {"label": "kp"}, key="kp")
    drain()
    child = enqueue(STEP, {"label": "kc"}, after=[parent.id])
    assert not is_blocked(child)
    drain()
    assert marker_of(child).result["saw"] == {"kp": {"label": "kp", "saw": {}}}


@pytest.mark.django_db
def test_a_dead_parent_named_by_its_old_id_is_followed_to_its_replay():
    unkeyed = enqueue(FRAGILE, {"label": "f"})
    keyed = enqueue(FRAGILE, {"label": "g"}, key="gk")
    drain()
    Audit.objects.create(label="bbheal|f")
    Audit.objects.create(label="bbheal|g")
    control.replay(DeadLetter.objects.filter(id=unkeyed.id), by="test")
    drain()  # the unkeyed parent's replay is done; the keyed one is replayed, still live:
    control.replay(DeadLetter.objects.filter(id=keyed.id), by="test")
    after_done = enqueue(STEP, {"label": "after-done"}, after=[unkeyed.id])
    after_live = enqueue(STEP, {"label": "after-live"}, after=[keyed.id])
    assert not is_blocked(after_done)
    assert is_blocked(after_live)
    drain()
    # Keyed by the replay's own id, which the child never named: the docs leave it open
    # (the replay made with no dependent waiting kept no tie to the old id), so only the
    # result is checked here.
    assert list(marker_of(after_done).result["saw"].values()) == [{"label": "f", "healed": True}]
    assert marker_of(after_live).result["saw"] == {"gk": {"label": "g", "healed": True}}


@pytest.mark.django_db
def test_a_conflicting_key_refuses_the_whole_workflow():
    enqueue(STEP, {"label": "orig"}, key="held")
    with pytest.raises(IdempotencyConflict), workflow(name="conflict") as w:
        w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "other"}, key="held")
    assert Job.objects.count() == 1
    assert not WorkflowStep.objects.exists() and not Dependency.objects.exists()


@pytest.mark.django_db
def test_a_keyed_step_held_by_a_live_job_makes_its_dependents_wait_for_that_job():
    holder = enqueue(STEP, {"label": "live"}, key="live")
    with workflow(name="held") as w:
        again = w.enqueue(STEP, {"label": "live"}, key="live")
        child = w.enqueue(STEP, {"label": "child", "parents": ["live"]}, after=[again])
    assert w.results[0].duplicate and w.results[0].id == holder.id
    assert Job.objects.count() == 2 and is_blocked(child)
    drain()
    assert ran("live") == 1 and Audit.objects.filter(label="bb|child|0").exists()


@pytest.mark.django_db
def test_a_written_workflow_takes_no_more_steps():
    with workflow(name="closed") as w:
        a = w.enqueue(STEP, {"label": "a"})
    with pytest.raises(InvalidJob):
        w.enqueue(STEP, {"label": "late"}, after=[a])
    assert Job.objects.count() == 1 and WorkflowStep.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_big_fan_out_and_fan_in_is_a_handful_of_statements(django_assert_max_num_queries):
    """docs/workflows.md: steps without a key, edges and WorkflowStep rows: one COPY each."""
    with django_assert_max_num_queries(10), workflow(name="bulk") as w:
        root = w.enqueue(STEP, {"label": "root"})
        leaves = [w.enqueue(STEP, {"label": f"l{i}"}, after=[root]) for i in range(2000)]
        w.enqueue(STEP, {"label": "join"}, after=leaves)
    assert Job.objects.count() == 2002
    assert Dependency.objects.count() == 4000
    assert WorkflowStep.objects.filter(workflow="bulk").count() == 2002


# ---- rollback: the enqueuing transaction takes everything with it -----------


@pytest.mark.django_db(transaction=True)
def test_rollback_leaves_no_step_no_edge_and_no_count_on_the_parent():
    parent = enqueue(STEP, {"label": "p"})
    before = Job.objects.values("dependents", "waiting_for").get(id=parent.id)
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit(STEP, {"label": "c1"}, after=[parent])
        enqueue(STEP, {"label": "c2"}, after=[parent], on_parent_dead="dead")
        with workflow(name="rolled-back") as w:
            x = w.enqueue(STEP, {"label": "x"}, after=[parent])
            w.enqueue(STEP, {"label": "y"}, after=[x])
        assert Job.objects.count() == 5  # written in the transaction...
        raise RuntimeError("the view failed")
    # ...and gone with it.
    assert list(Job.objects.values_list("id", flat=True)) == [parent.id]
    assert not Dependency.objects.exists() and not WorkflowStep.objects.exists()
    assert Job.objects.values("dependents", "waiting_for").get(id=parent.id) == before
    # The parent settles like a job nobody waits for.
    call_command("runjobs", "--burst")
    assert ran("p") == 1 and not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_workflow_outside_a_transaction_writes_every_step_at_exit():
    with workflow(name="autocommit") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "b"}, after=[a])
        assert not Job.objects.exists()  # nothing before the block exits
    assert Job.objects.count() == 2
    assert WorkflowStep.objects.filter(workflow="autocommit").count() == 2
    call_command("runjobs", "--burst")
    assert ran("a") == ran("b") == 1


# ---- workflow(): misuse ------------------------------------------------------


@pytest.mark.django_db
def test_an_exception_inside_the_block_writes_nothing():
    parent = enqueue(STEP, {"label": "outside"})
    with pytest.raises(KeyError), workflow(name="boom") as w:
        a = w.enqueue(STEP, {"label": "a"}, after=[parent])
        w.enqueue(STEP, {"label": "b"}, after=[a], key="b-key")
        raise KeyError("boom")
    assert list(Job.objects.values_list("id", flat=True)) == [parent.id]
    assert not Dependency.objects.exists() and not WorkflowStep.objects.exists()
    assert Job.objects.get(id=parent.id).dependents == 0
    # The key was never taken: it can be used now.
    assert not enqueue(STEP, {"label": "b"}, key="b-key").duplicate


@pytest.mark.django_db
def test_an_outside_parent_found_nowhere_fails_the_block_at_exit():
    with pytest.raises(InvalidJob), workflow(name="lost-parent") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "b"}, after=[a, "nobody-has-this-key"])
    assert nothing_written()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", "x" * 256, "tab\there", "nul\x00", "new\nline"])
def test_workflow_names_must_be_printable_and_short(name):
    with pytest.raises(InvalidJob), workflow(name=name) as w:
        w.enqueue(STEP, {"label": "a"})
    assert nothing_written()


@pytest.mark.django_db
def test_a_workflow_name_of_255_characters_is_fine():
    name = "é" * 255
    with workflow(name=name) as w:
        w.enqueue(STEP, {"label": "a"})
    assert WorkflowStep.objects.get().workflow == name


@pytest.mark.django_db
def test_an_invalid_step_refuses_the_whole_block():
    with pytest.raises(InvalidJob), workflow(name="bad-step") as w:
        w.enqueue(STEP, {"label": "a"})
        w.enqueue("tests.bb.no_such_handler", {})
    assert nothing_written()
    with pytest.raises(InvalidJob), workflow(name="bad-ond") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "b"}, after=[a], on_parent_dead="sometimes")
    assert nothing_written()


@pytest.mark.django_db
def test_the_same_key_twice_is_one_step():
    with workflow(name="dupes") as w:
        first = w.enqueue(STEP, {"label": "once"}, key="once")
        second = w.enqueue(STEP, {"label": "once"}, key="once")
        w.enqueue(STEP, {"label": "after"}, after=[first, second, "once"])
    assert second.duplicate and second.id == first.id
    # One step per key: the second call made none (docs/workflows.md, "one result per step").
    assert [r.id for r in w.results][0] == first.id and len(w.results) == 2
    assert Job.objects.count() == 2
    drain()
    assert ran("once") == 1 and ran("after") == 1


@pytest.mark.django_db
def test_a_keyed_step_whose_key_is_done_waits_for_nothing_and_is_not_written():
    enqueue(STEP, {"label": "done-before"}, key="shared")
    drain()
    holder = CompletionMarker.objects.get(key="shared")
    with workflow(name="reuse") as w:
        again = w.enqueue(STEP, {"label": "done-before"}, key="shared")
        after = w.enqueue(STEP, {"label": "next"}, after=[again])
    result = w.results[0]
    assert result.duplicate and result.id == holder.job_id
    assert not is_blocked(after)
    drain()
    assert ran("done-before") == 1
    assert marker_of(after).result["saw"] == {"shared": {"label": "done-before", "saw": {}}}


@pytest.mark.django_db
def test_a_nested_workflow_cannot_wait_for_an_unwritten_step_of_the_outer_one():
    """The outer step is not written yet: "a parent found nowhere" fails, nothing is written."""
    with pytest.raises(InvalidJob), workflow(name="outer") as outer:
        a = outer.enqueue(STEP, {"label": "a"})
        with workflow(name="inner") as inner:
            inner.enqueue(STEP, {"label": "b"}, after=[a])
    assert nothing_written()


@pytest.mark.django_db
def test_nested_workflows_write_each_under_its_own_name():
    with workflow(name="outer") as outer:
        a = outer.enqueue(STEP, {"label": "a"})
        with workflow(name="inner") as inner:
            b = inner.enqueue(STEP, {"label": "b"})
        outer.enqueue(STEP, {"label": "c"}, after=[a, b])
    assert set(WorkflowStep.objects.values_list("workflow", flat=True)) == {"outer", "inner"}
    assert WorkflowStep.objects.filter(workflow="outer").count() == 2
    drain()
    assert [ran(x) for x in "abc"] == [1, 1, 1]


# ---- timing of a blocked step --------------------------------------------------


@pytest.mark.django_db
def test_a_blocked_steps_delay_counts_from_its_release():
    parent = enqueue(STEP, {"label": "p"})
    with workflow(name="timed") as w:
        later = w.enqueue(STEP, {"label": "later"}, after=[parent], delay=3600)
        past = w.enqueue(
            STEP, {"label": "past"}, after=[parent], run_at=timezone.now() - timedelta(days=1)
        )
        future_at = timezone.now() + timedelta(days=2)
        future = w.enqueue(STEP, {"label": "future"}, after=[parent], run_at=future_at)
    assert all(is_blocked(r) for r in (later, past, future))
    drain()  # runs the parent and whatever it releases that is due
    assert ran("past") == 1
    assert ran("later") == 0 and ran("future") == 0
    scheduled = Job.objects.scheduled()
    assert set(scheduled.values_list("id", flat=True)) == {later.id, future.id}
    released = timezone.now()
    later_at = Job.objects.get(id=later.id).run_at
    assert released + timedelta(minutes=55) < later_at < released + timedelta(minutes=65)
    assert Job.objects.get(id=future.id).run_at == future_at


# ---- dead parents ----------------------------------------------------------------


@pytest.mark.django_db
def test_wait_stays_blocked_until_the_parents_letter_is_replayed_and_succeeds():
    parent = enqueue(FRAGILE, {"label": "charge"}, key="charge-1")
    child = enqueue(STEP, {"label": "ship", "parents": ["charge-1"]}, after=["charge-1"])
    drain()
    assert DeadLetter.objects.get(id=parent.id).reason == "fatal"
    assert is_blocked(child) and ran("ship") == 0
    # A second replay of a still-failing parent keeps it blocked.
    control.replay(DeadLetter.objects.pending(), by="test")
    drain()
    assert is_blocked(child)
    Audit.objects.create(label="bbheal|charge")
    report = control.replay(DeadLetter.objects.pending(), by="test")
    assert len(report.replayed) == 1
    drain()
    assert Audit.objects.filter(label="bb|ship|0").count() == 1
    assert marker_of(child).result["saw"] == {"charge-1": {"label": "charge", "healed": True}}


@pytest.mark.django_db
def test_wait_on_an_unkeyed_parent_is_released_by_its_replay():
    parent = enqueue(FRAGILE, {"label": "nokey"})
    child = enqueue(STEP, {"label": "after-nokey"}, after=[parent])
    drain()
    Audit.objects.create(label="bbheal|nokey")
    control.replay(DeadLetter.objects.pending(), by="test")
    drain()
    assert ran("after-nokey") == 1
    # Replayed, a parent without a key is still named by its handler.
    assert list(marker_of(child).result["saw"]) == [FRAGILE]


@pytest.mark.django_db
def test_dead_cascades_and_a_replay_before_the_parent_succeeds_waits_again():
    with workflow(name="cascade") as w:
        a = w.enqueue(FRAGILE, {"label": "a"}, key="cascade-a")
        b = w.enqueue(STEP, {"label": "b"}, after=[a], on_parent_dead="dead")
        c = w.enqueue(STEP, {"label": "c"}, after=[b], on_parent_dead="dead")
        d = w.enqueue(STEP, {"label": "d"}, after=[b])  # "wait"
    drain()
    letters = dict(DeadLetter.objects.values_list("id", "reason"))
    assert letters == {a.id: "fatal", b.id: "parent_dead", c.id: "parent_dead"}
    assert is_blocked(d)
    # Replay b first: its parent is still dead, so it waits again.
    control.replay(DeadLetter.objects.filter(id=b.id), by="test")
    drain()
    assert ran("b") == 0
    replay_b = DeadLetter.objects.get(id=b.id).replay_job_id
    assert Job.objects.blocked().filter(id=replay_b).exists()
    # Now heal and replay a: b's replay runs, then d (it waited for b's key).
    Audit.objects.create(label="bbheal|a")
    control.replay(DeadLetter.objects.filter(id=a.id), by="test")
    drain()
    assert ran("a") == 1 and ran("b") == 1 and ran("d") == 1
    assert ran("c") == 0  # its letter is still pending
    control.replay(DeadLetter.objects.filter(id=c.id), by="test")
    drain()
    assert ran("c") == 1
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_child_of_an_already_dead_parent():
    enqueue(FRAGILE, {"label": "gone"}, key="gone")
    drain()
    dead = enqueue(STEP, {"label": "dead-child"}, after=["gone"], on_parent_dead="dead")
    waiting = enqueue(STEP, {"label": "wait-child"}, after=["gone"])
    letter = DeadLetter.objects.get(id=dead.id)
    assert letter.reason == "parent_dead"
    assert not Job.objects.filter(id=dead.id).exists()
    assert is_blocked(waiting)
    # Replaying the child before the parent makes it wait for that parent.
    control.replay(DeadLetter.objects.filter(id=dead.id), by="test")
    replay = DeadLetter.objects.get(id=dead.id).replay_job_id
    assert Job.objects.blocked().filter(id=replay).exists()
    Audit.objects.create(label="bbheal|gone")
    control.replay(DeadLetter.objects.filter(key="gone"), by="test")
    drain()
    assert ran("dead-child") == 1 and ran("wait-child") == 1


# ---- cancel -------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_workflow_dead_letters_its_waiting_and_blocked_steps_only():
    outside = enqueue(STEP, {"label": "outside"})
    with workflow(name="order-42") as w:
        a = w.enqueue(STEP, {"label": "a"})
        b = w.enqueue(STEP, {"label": "b"}, after=[a, outside])
        w.enqueue(STEP, {"label": "c"}, after=[b])
    result = cancel_workflow("order-42", by="tester")
    assert (result.cancelled, result.requested) == (3, 0)
    assert set(DeadLetter.objects.values_list("reason", flat=True)) == {"cancelled"}
    assert list(Job.objects.values_list("id", flat=True)) == [outside.id]
    again = cancel_workflow("order-42")
    assert (again.cancelled, again.requested) == (0, 0)


@pytest.mark.django_db
def test_cancel_workflow_leaves_finished_steps_alone():
    with workflow(name="half-done") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(FRAGILE, {"label": "b"}, after=[a])
        w.enqueue(STEP, {"label": "c"})
    drain(until_empty=False)  # a and c run; b becomes due
    drain()  # b dies
    assert cancel_workflow("half-done").cancelled == 0
    assert DeadLetter.objects.get().reason == "fatal"


@pytest.mark.django_db
def test_jobs_cancel_workflow_command():
    with workflow(name="order-1") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "b"}, after=[a])
    out = StringIO()
    call_command("jobs", "cancel", "--workflow", "order-1", stdout=out)
    text = out.getvalue()
    assert "order-1" in text and "cancelled 2" in text
    assert set(DeadLetter.objects.values_list("reason", flat=True)) == {"cancelled"}
    assert not Job.objects.exists()
    # Nothing live left: zeros, and a word on stderr.
    out, err = StringIO(), StringIO()
    call_command("jobs", "cancel", "--workflow", "order-1", stdout=out, stderr=err)
    assert "cancelled 0" in out.getvalue() and err.getvalue().strip()
    with pytest.raises(CommandError, match="no workflow named") as refused:
        call_command("jobs", "cancel", "--workflow", "order-999")
    assert refused.value.returncode == 1


@pytest.mark.django_db
@pytest.mark.parametrize("args", [[], ["--workflow", "order-1", str(uuid.uuid4())]])
def test_jobs_cancel_needs_ids_or_a_workflow_not_both(args):
    with workflow(name="order-1") as w:
        w.enqueue(STEP, {"label": "a"})
    with pytest.raises(CommandError) as refused:
        call_command("jobs", "cancel", *args)
    assert refused.value.returncode == 2
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_cancelled_step_stays_cancelled_when_its_outside_parent_finishes():
    outside = enqueue(STEP, {"label": "outside"})
    with workflow(name="cx") as w:
        step = w.enqueue(STEP, {"label": "in"}, after=[outside])
    assert cancel_workflow("cx").cancelled == 1
    drain()
    assert ran("outside") == 1 and ran("in") == 0
    assert not Job.objects.exists()
    # Its replay finds the parent done, and runs.
    control.replay(DeadLetter.objects.filter(id=step.id), by="test")
    drain()
    assert ran("in") == 1


@pytest.mark.django_db
def test_cancelling_a_parent_is_a_dead_parent():
    """docs/workflows.md: dead-lettering a job, cancel included, follows on_parent_dead."""
    parent = enqueue(STEP, {"label": "p"}, delay=600)
    dead = enqueue(STEP, {"label": "d"}, after=[parent], on_parent_dead="dead")
    waiting = enqueue(STEP, {"label": "w"}, after=[parent])
    out = StringIO()
    call_command("jobs", "cancel", str(parent.id), stdout=out)
    assert "cancelled 1" in out.getvalue()
    assert DeadLetter.objects.get(id=dead.id).reason == "parent_dead"
    assert is_blocked(waiting)
    control.replay(DeadLetter.objects.filter(id=parent.id), by="test")
    drain()
    assert ran("p") == 1 and ran("w") == 1 and ran("d") == 0


# ---- status --------------------------------------------------------------------------


@pytest.mark.django_db
def test_jobs_status_counts_blocked_jobs_apart():
    parent = enqueue(STEP, {"label": "p"})
    for i in range(3):
        enqueue(STEP, {"label": f"c{i}"}, after=[parent], delay=60)
    enqueue(STEP, {"label": "later"}, delay=600)
    out = StringIO()
    call_command("jobs", "status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    text = json.dumps(data)
    assert '"blocked": 3' in text, text
    assert '"scheduled": 1' in text, text
    assert '"waiting": 1' in text, text
    table = StringIO()
    call_command("jobs", "status", stdout=table)
    header = table.getvalue().splitlines()[0]
    assert "blocked" in header


# ---- the admin -----------------------------------------------------------------------


def _workflow_page(client, name):
    """Find the workflow's page from the Workflows list, as an operator would."""
    listing = client.get("/admin/django_jobs/workflowstep/")
    assert listing.status_code == 200
    html = text_of(listing)
    assert escape(name) in html
    links = re.findall(r'href="([^"]*workflow/\?[^"]*)"', html)
    assert links, "the Workflows list links no workflow page"
    link = next(href for href in links if href.endswith(urlencode({"name": name})))
    page = client.get(link.replace("&amp;", "&"))
    assert page.status_code == 200
    return text_of(page)


def text_of(response):
    """The page, without the <wbr> hints that break long words."""
    return response.content.decode().replace("<wbr>", "")


@pytest.mark.django_db
def test_admin_workflow_page_draws_an_svg_graph_without_external_urls(admin_client_):
    with workflow(name="order-<42>") as w:
        a = w.enqueue(STEP, {"label": "charge"}, key="charge-42")
        b = w.enqueue(FRAGILE, {"label": "reserve"}, after=[a])
        c = w.enqueue(STEP, {"label": "confirm"}, after=[a])
        w.enqueue(STEP, {"label": "ship"}, after=[b, c])
    drain()  # charge and confirm done, reserve dead, ship blocked
    html = _workflow_page(admin_client_, "order-<42>")
    assert "<svg" in html
    assert "order-&lt;42&gt;" in html and "order-<42>" not in html  # escaped
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert not re.search(r'(?:href|src)="(?:https?:)?//', svg), "an external URL in the graph"
    assert "<script" not in svg
    for url in re.findall(r'(?:href|src)="([^"]+)"', html):
        assert not url.startswith(("http://", "https://", "//")), url
    # Links to the finished step's marker, the dead one's letter and the blocked one's job.
    assert str(marker_of(a).job_id) in html
    assert str(b.id) in html and "/deadletter/" in html
    assert "/completionmarker/" in html and "/job/" in html


@pytest.mark.django_db
def test_admin_blocked_job_page_lists_its_parents(admin_client_):
    parent = enqueue(STEP, {"label": "p"}, key="parent-key")
    child = enqueue(STEP, {"label": "c"}, after=["parent-key"])
    page = admin_client_.get(f"/admin/django_jobs/job/{child.id}/change/")
    assert page.status_code == 200
    html = text_of(page)
    assert "parent-key" in html and str(parent.id) in html
    listing = admin_client_.get("/admin/django_jobs/job/")
    assert listing.status_code == 200
    assert "after its parents" in text_of(listing)


@pytest.mark.django_db
def test_admin_cancels_a_workflow_only_with_the_permission(login):
    with workflow(name="to-cancel") as w:
        a = w.enqueue(STEP, {"label": "a"})
        w.enqueue(STEP, {"label": "b"}, after=[a])
    viewer = login("view_workflowstep", "view_job")
    html = _workflow_page(viewer, "to-cancel")
    assert "Cancel this workflow" not in html
    forged = viewer.post("/admin/django_jobs/workflowstep/workflow/cancel/", {"name": "to-cancel"})
    assert forged.status_code in (302, 403)
    assert Job.objects.count() == 2
    operator = login("view_workflowstep", "view_job", "cancel_job")
    html = _workflow_page(operator, "to-cancel")
    assert "Cancel this workflow" in html
    form = re.search(r'<form[^>]*action="([^"]*cancel[^"]*)"', html)
    assert form, "no cancel form on the workflow page"
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    fields.pop("csrfmiddlewaretoken", None)
    operator.post(form.group(1), fields, follow=True)
    assert not Job.objects.exists()
    assert DeadLetter.objects.filter(reason="cancelled").count() == 2


@pytest.mark.django_db
def test_admin_big_workflow_is_not_drawn_but_paged(admin_client_):
    with workflow(name="wide") as w:
        root = w.enqueue(STEP, {"label": "root"})
        for i in range(320):
            w.enqueue(STEP, {"label": f"leaf{i}"}, after=[root])
    html = _workflow_page(admin_client_, "wide")
    assert "not drawn" in html
    # The first layer holds the root, the second the 320 leaves; the steps come 100 to a page.
    layers = re.search(r'id="django-jobs-workflow-layers".*?</table>', html, re.S).group(0)
    assert re.findall(r"<td[^>]*>(\d+)</td>", layers) == ["1", "1", "2", "320"], layers
    assert html.count('class="django-jobs-step"') == 100


@pytest.mark.django_db
def test_admin_workflow_names_that_need_escaping_reach_their_page(admin_client_):
    names = ["a&b=c #1?x%20", "ünï cödé 漢字", "'\"<script>alert(1)</script>", "+plus+ space"]
    for name in names:
        with workflow(name=name) as w:
            w.enqueue(STEP, {"label": name})
    for name in names:
        html = _workflow_page(admin_client_, name)
        assert "<script>alert" not in html
        assert html.count('class="django-jobs-step"') == 1, name
    nul = admin_client_.get("/admin/django_jobs/workflowstep/workflow/", {"name": "a\x00"})
    assert nul.status_code == 400


@pytest.mark.django_db
def test_metrics_count_blocked_jobs_apart(admin_client_, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "METRICS": True}
    parent = enqueue(STEP, {"label": "p"})
    enqueue(STEP, {"label": "c1"}, after=[parent])
    enqueue(STEP, {"label": "c2"}, after=[parent], delay=30)
    text = admin_client_.get("/metrics/jobs").content.decode()
    assert 'django_jobs_queue_jobs{queue="default",state="blocked"} 2.0' in text
    assert 'django_jobs_queue_jobs{queue="default",state="waiting"} 1.0' in text
    assert 'django_jobs_queue_jobs{queue="default",state="scheduled"} 0.0' in text


@pytest.mark.django_db
def test_admin_follows_dead_parents_and_replays(admin_client_):
    with workflow(name="adm") as w:
        a = w.enqueue(STEP, {"label": "a"})
        b = w.enqueue(FRAGILE, {"label": "b"}, after=[a], key="adm-b")
        c = w.enqueue(STEP, {"label": "c"}, after=[b], on_parent_dead="dead")
        d = w.enqueue(STEP, {"label": "d"}, after=[b])
        w.enqueue(STEP, {"label": "e"})
    drain()
    # The list counts the steps by state: steps, done, running, waiting, blocked, dead.
    listing = text_of(admin_client_.get("/admin/django_jobs/workflowstep/"))
    row = re.search(r'name=adm".*?</tr>', listing, re.S).group(0)
    counts = re.findall(r'<td class="num">(?:<[^>]+>)?(\d+)(?:</\w+>)?</td>', row)
    assert counts == ["5", "2", "0", "0", "1", "2"]
    # A parent_dead letter names its parents; a blocked job links its dead parent's letter.
    letter = text_of(admin_client_.get(f"/admin/django_jobs/deadletter/{c.id}/change/"))
    assert "adm-b" in letter and str(b.id) in letter
    blocked = text_of(admin_client_.get(f"/admin/django_jobs/job/{d.id}/change/"))
    assert "adm-b" in blocked and f"/deadletter/{b.id}/" in blocked
    # A replayed step is followed to its replay: its job, then its marker.
    Audit.objects.create(label="bbheal|b")
    control.replay(DeadLetter.objects.filter(id=b.id), by="test")
    replay = DeadLetter.objects.get(id=b.id).replay_job_id
    assert f"/job/{replay}/" in _workflow_page(admin_client_, "adm")
    drain()
    assert f"/completionmarker/{replay}/" in _workflow_page(admin_client_, "adm")


# ---- retention -----------------------------------------------------------------------


@pytest.mark.django_db
def test_prunejobs_dry_run_counts_what_the_real_run_deletes():
    with workflow(name="old") as w:
        a = w.enqueue(STEP, {"label": "a"})
        b = w.enqueue(STEP, {"label": "b"}, after=[a])
        w.enqueue(FRAGILE, {"label": "c"}, after=[b])
    blocker = enqueue(FRAGILE, {"label": "blocker"}, key="blocker")
    kept_waiting = enqueue(STEP, {"label": "waits"}, after=["blocker"])
    drain()
    long_ago = timezone.now() - timedelta(days=400)
    CompletionMarker.objects.update(completed_at=long_ago)
    DeadLetter.objects.update(dead_at=long_ago)
    dry = StringIO()
    call_command("prunejobs", "--dry-run", "--markers", "30d", "--dead-letters", "30d", stdout=dry)
    assert CompletionMarker.objects.count() == 2 and DeadLetter.objects.count() == 2
    real = StringIO()
    call_command("prunejobs", "--markers", "30d", "--dead-letters", "30d", stdout=real)

    def figures(text):
        return re.findall(
            r"(\d+) (completion marker|dead letter|workflow dependency edge|"
            r"workflow step row)",
            text,
        )

    assert figures(dry.getvalue()) == figures(real.getvalue()), (dry.getvalue(), real.getvalue())
    assert "would delete" in dry.getvalue() and "deleted" in real.getvalue()
    # The letter a blocked job waits for is kept, and so is that job's edge.
    assert DeadLetter.objects.filter(id=blocker.id).exists()
    assert is_blocked(kept_waiting)
    assert Dependency.objects.filter(job_id=kept_waiting.id).exists()
    # b's marker stays while c's letter, which names it, is pending; the letter
    # went after it in the same pass, so the next pass takes the marker.
    assert list(CompletionMarker.objects.values_list("job_id", flat=True)) == [b.id]
    call_command("prunejobs", "--markers", "30d", "--dead-letters", "30d", stdout=StringIO())
    assert not CompletionMarker.objects.exists()
    assert not WorkflowStep.objects.filter(workflow="old").exists()


# ---- Django's Tasks API ----------------------------------------------------------------


@pytest.mark.django_db
def test_tasks_join_a_workflow_through_enqueue_step():
    pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")
    from django.tasks import TaskResultStatus

    from django_jobs.tasks.backend import enqueue_step
    from tests.testapp.tasks import add, record

    later = timezone.now() + timedelta(hours=2)
    with workflow(name="tasks-flow") as w:
        summed = enqueue_step(w, add, [2, 3])
        noted = enqueue_step(w, record, kwargs={"label": "after-add"}, after=[summed])
        # run_after holds once its parents have finished: due at the later of the two.
        held = enqueue_step(w, record.using(run_after=later), ["held"], after=[summed])
    assert record.get_result(str(noted.id)).status == TaskResultStatus.READY
    assert is_blocked(noted) and is_blocked(held)
    drain()
    assert Job.objects.scheduled().get().id == held.id
    assert Job.objects.get(id=held.id).run_at == later
    assert add.get_result(str(summed.id)).return_value == 5
    assert record.get_result(str(noted.id)).status == TaskResultStatus.SUCCESSFUL
    assert Audit.objects.filter(label="after-add").count() == 1


# ---- real worker processes -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_diamond_on_three_workers(worker_process):
    """No step starts before its parents' markers exist; ship sees both parents' results."""
    orders = 20
    for n in range(orders):
        with transaction.atomic(), workflow(name=f"order-{n}") as w:
            charge = w.enqueue(STEP, {"label": f"charge{n}"}, key=f"charge-{n}")
            reserve = w.enqueue(
                STEP, {"label": f"reserve{n}", "parents": [f"charge-{n}"]}, after=[charge]
            )
            confirm = w.enqueue(
                STEP,
                {"label": f"confirm{n}", "parents": [f"charge-{n}"]},
                after=[charge],
                key=f"confirm-{n}",
            )
            w.enqueue(
                STEP,
                {"label": f"ship{n}", "parents": [str(reserve.id), f"confirm-{n}"]},
                after=[reserve, confirm],
                key=f"ship-{n}",
            )
    workers = start_workers(worker_process, 3, "--concurrency", "4")
    wait_for(
        lambda: CompletionMarker.objects.count() == 4 * orders,
        timeout=60,
        message="every step's marker",
    )
    stop_workers(workers)
    starts = list(Audit.objects.values_list("label", flat=True))
    assert len(starts) == 4 * orders, starts  # each step ran once
    assert all(label.endswith("|0") for label in starts), starts
    for n in range(orders):
        ship = CompletionMarker.objects.get(key=f"ship-{n}").result
        assert set(ship["saw"]) == {STEP, f"confirm-{n}"}  # reserve has no key
        assert ship["saw"][f"confirm-{n}"]["label"] == f"confirm{n}"
    assert not Job.objects.exists()


@pytest.mark.slow
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_fan_out_fan_in_under_a_kill_storm(worker_process):
    chunks = 1000
    with transaction.atomic(), workflow(name="storm") as w:
        parts = [w.enqueue("tests.bb.chunk", {"i": i}) for i in range(chunks)]
        join = w.enqueue("tests.bb.total", {}, after=parts)
    assert WorkflowStep.objects.filter(workflow="storm").count() == chunks + 1
    args = ("--concurrency", "4", "--lease", "2", "--heartbeat", "0.5", "--batch", "20")
    workers = [worker_process(*args) for _ in range(3)]
    kills = 0
    # A wedge, not a slow machine, fails the test: it fails when no step finished for
    # 30 s (more than a killed worker's lease and a rescue), or after 5 minutes in all.
    done, progressed, deadline = 0, time.monotonic(), time.monotonic() + 300
    while not CompletionMarker.objects.filter(job_id=join.id).exists():
        now_done = CompletionMarker.objects.count()
        if now_done > done:
            done, progressed = now_done, time.monotonic()
        stalled = time.monotonic() - progressed
        assert stalled < 30, f"no step finished for {stalled:.0f} s ({done} of {chunks + 1} done)"
        assert time.monotonic() < deadline, f"the fan-in never finished ({done} done)"
        time.sleep(0.4)
        if kills < 6:
            victim = workers[kills % 3]
            victim.signal(signal.SIGKILL)
            victim.wait()
            workers[kills % 3] = worker_process(*args)
            kills += 1
    for proc in workers:
        proc.signal(signal.SIGTERM)
    for proc in workers:
        proc.wait()
    # Atomic chunks: one effect each, however many attempts were killed.
    labels = list(Audit.objects.values_list("label", flat=True))
    assert sorted(labels) == sorted([f"bbchunk|{i}" for i in range(chunks)] + [f"bbtotal|{chunks}"])
    assert marker_of(join).result == sum(range(chunks))
    assert not Job.objects.exists() and not DeadLetter.objects.exists()
    assert kills >= 1


@pytest.mark.slow
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_dependents_enqueued_while_workers_settle_their_parents(worker_process):
    """A child written while its parent is claimed, run or dead-lettered is never lost.

    Each outcome is checked against the docs: a succeeded parent's child runs; a dead
    parent's "dead" child is dead-lettered as parent_dead, its "wait" child stays blocked.
    """
    workers = start_workers(worker_process, 2, "--concurrency", "4")
    kinds = [STEP, "tests.bb.chunk", FRAGILE]
    pairs = []
    for i in range(240):
        kind = kinds[i % 3]
        key = f"race-{i}" if i % 2 else None
        parent = enqueue(kind, {"label": f"p{i}", "i": i}, key=key)
        named = [parent, parent.id, key or str(parent.id)][(i // 3) % 3]
        mode = "dead" if i % 4 < 2 else "wait"
        child = enqueue(STEP, {"label": f"c{i}"}, after=[named], on_parent_dead=mode)
        pairs.append((kind, mode, child))
    wait_for(
        lambda: not Job.objects.exclude(waiting_for__gt=0).exists(),
        timeout=60,
        message="every job not blocked to finish",
    )
    stop_workers(workers)
    wrong = []
    for kind, mode, child in pairs:
        if kind != FRAGILE:
            ok = CompletionMarker.objects.filter(job_id=child.id).exists()
        elif mode == "dead":
            ok = DeadLetter.objects.filter(id=child.id, reason="parent_dead").exists()
        else:
            ok = is_blocked(child)
        if not ok:
            wrong.append((kind, mode, child.id))
    assert not wrong, wrong


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_cancel_workflow_asks_the_worker_of_a_running_step(worker_process):
    with workflow(name="running-one") as w:
        first = w.enqueue("tests.bb.stubborn", {})
        w.enqueue(STEP, {"label": "next"}, after=[first])
    (worker,) = start_workers(worker_process, 1, "--concurrency", "2", "--heartbeat", "0.3")
    wait_for(lambda: Audit.objects.filter(label="bbrunning").exists(), message="the step to run")
    out = StringIO()
    call_command("jobs", "cancel", "--workflow", "running-one", stdout=out)
    assert "cancelled 1 job(s) (1 blocked); " in out.getvalue() and "1 running" in out.getvalue()
    wait_for(lambda: DeadLetter.objects.filter(id=first.id).exists(), message="the step to stop")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert set(DeadLetter.objects.values_list("reason", flat=True)) == {"cancelled"}
    assert not Job.objects.exists() and ran("next") == 0
