"""Workflows (issue 15) in-process, on every engine: rollback, blocked steps, random DAGs.

The property test draws random DAGs (each node's parents among earlier nodes, some
nodes failing, each with on_parent_dead "wait" or "dead"), writes them with
workflow() and enqueue(after=...), drains them through the worker's own claim
and settle (django_jobs.testing.drain), and checks the outcome against a model of
docs/workflows.md; then it replays every letter, in a drawn order, and checks
that everything ran exactly once after its parents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobs import enqueue, testing, workflow
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    JobState,
    WorkflowStep,
)
from tests.testapp import workflow_jobs
from tests.testapp.models import Audit


class Boom(Exception):
    pass


def clean():
    for model in (Job, Dependency, WorkflowStep, CompletionMarker, DeadLetter, Audit):
        model.objects.all().delete()


def starts(label):
    """The parents-missing count of each start of a step, in order."""
    rows = Audit.objects.filter(label__startswith=f"start|{label}|").order_by("pk")
    return [int(label.rsplit("|", 1)[1]) for label in rows.values_list("label", flat=True)]


# ---- rollback ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["inside the block", "after the block", "savepoint"])
def test_a_rolled_back_enqueue_writes_no_step_edge_or_workflow_row(where):
    step = workflow_jobs.step
    outside = enqueue(step, {"label": "outside"}, key="outside")  # a live parent, committed

    def write():
        with workflow(name="rolled-back") as w:
            a = w.enqueue(step, {"label": "a"}, after=[outside])
            w.enqueue(step, {"label": "b"}, after=[a, "outside"], on_parent_dead="dead")
            if where == "inside the block":
                raise Boom
        enqueue(step, {"label": "c"}, after=[a, outside.id])  # after a step, outside the block
        raise Boom

    if where == "savepoint":
        # The caller's transaction commits; the savepoint the workflow was written in does not.
        with transaction.atomic():
            kept = enqueue(step, {"label": "kept"})
            with pytest.raises(Boom), transaction.atomic():
                write()
        expected = {outside.id, kept.id}
    else:
        with pytest.raises(Boom), transaction.atomic():
            write()
        expected = {outside.id}
    assert set(Job.objects.values_list("id", flat=True)) == expected
    # The parent's count of dependents went back with the transaction that took it.
    assert set(Job.objects.values_list("dependents", "waiting_for")) == {(0, 0)}
    assert Dependency.objects.count() == 0
    assert WorkflowStep.objects.count() == 0
    drained = testing.drain()
    assert sorted(a.payload["label"] for a in drained.succeeded) == sorted(
        ["outside", "kept"][: len(expected)]
    )
    assert Job.objects.count() == 0


# ---- a blocked step is never due ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_now_and_drain_of_scheduled_jobs_leave_blocked_steps_blocked():
    with transaction.atomic(), workflow(name="held") as w:
        root = w.enqueue(workflow_jobs.step, {"label": "root", "fail": "fatal"})
        child = w.enqueue(workflow_jobs.step, {"label": "child"}, after=[root])
        w.enqueue(workflow_jobs.step, {"label": "grandchild"}, after=[child], on_parent_dead="dead")
    drained = testing.drain()
    assert [(a.payload["label"], a.outcome) for a in drained.attempts] == [("root", "dead")]
    # "Run now" (the admin's action) moves scheduled jobs: a blocked step is not one.
    assert Job.objects.all().run_now() == 0
    assert testing.drain(run_scheduled=True).attempts == []
    states = dict(Job.objects.with_state().values_list("id", "state"))
    assert len(states) == 2
    assert set(states.values()) == {JobState.BLOCKED}
    assert Job.objects.get(id=child.id).waiting_for == 1
    counts = [(r["waiting"], r["scheduled"], r["running"]) for r in Job.objects.counts_by_queue()]
    assert counts == [(0, 0, 0)]  # blocked steps are counted apart
    assert starts("child") == starts("grandchild") == []


# ---- random DAGs ---------------------------------------------------------------------

MAX_NODES = 30
OK, FAILED, PARENT_DEAD, BLOCKED = "ok", "failed", "parent_dead", "blocked"


@dataclass(frozen=True)
class Node:
    parents: tuple[int, ...]
    mode: str  # on_parent_dead
    # None; "fatal" (FatalError) or "error" (RuntimeError with max_attempts=1): dead-lettered;
    # "flaky": its first attempt fails, its retry succeeds.
    fail: str | None
    keyed: bool  # a dedupe key, or its id as idempotency key
    atomic: bool
    ref: str  # how its dependents name it in after=: "result", "id" or "text"
    twice: bool  # its dependents name it twice (by ref and by id): still one edge


@st.composite
def dags(draw):
    size = draw(st.integers(1, MAX_NODES))
    nodes = []
    for i in range(size):
        parents = draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4))) if i else set()
        nodes.append(
            Node(
                parents=tuple(sorted(parents)),
                mode=draw(st.sampled_from(["wait", "dead"])),
                fail=draw(st.sampled_from([None] * 5 + ["fatal", "error", "flaky"])),
                keyed=draw(st.booleans()),
                atomic=draw(st.booleans()),
                ref=draw(st.sampled_from(["result", "id", "text"])),
                twice=draw(st.booleans()),
            )
        )
    return nodes


def flaky_start(node):
    """The start record of a flaky step's failed first attempt (an atomic one rolls back)."""
    return node.fail == "flaky" and not node.atomic


def expected_outcomes(nodes):
    """What docs/workflows.md says each node ends as when everything due has run."""
    outcome: list[str] = []
    for node in nodes:
        parents = [outcome[p] for p in node.parents]
        dead_parent = any(o in (FAILED, PARENT_DEAD) for o in parents)
        if node.mode == "dead" and dead_parent:
            outcome.append(PARENT_DEAD)
        elif all(o == OK for o in parents):
            outcome.append(FAILED if node.fail in ("fatal", "error") else OK)
        else:
            outcome.append(BLOCKED)
    return outcome


def write(nodes, in_workflow):
    """Write nodes [0, in_workflow) as one workflow, the rest by enqueue(after=), in one commit."""
    results, keys = [], []

    def named(j):
        return {"result": results[j], "id": results[j].id, "text": keys[j]}[nodes[j].ref]

    def one(i, enqueue_function):
        node = nodes[i]
        handler = workflow_jobs.step_atomic if node.atomic else workflow_jobs.step
        payload = {"label": f"n{i}", "parents": [keys[p] for p in node.parents], "fail": node.fail}
        after = [named(p) for p in node.parents]
        after += [results[p].id for p in node.parents if nodes[p].twice]
        options = {"after": after}
        if node.parents:
            options["on_parent_dead"] = node.mode
        if node.keyed:
            options["key"] = f"key-n{i}"
        if node.fail == "error":
            options["max_attempts"] = 1
        elif node.fail == "flaky":
            options["max_attempts"] = 2
        result = enqueue_function(handler, payload, **options)
        results.append(result)
        keys.append(f"key-n{i}" if node.keyed else str(result.id))

    with transaction.atomic():
        with workflow(name="dag") as w:
            for i in range(in_workflow):
                one(i, w.enqueue)
        for i in range(in_workflow, len(nodes)):
            one(i, enqueue)
    return results, keys


def check_edges(nodes, job_ids, keys, finished):
    """Each node's job has one edge per parent, satisfied iff that parent finished."""
    for i, node in enumerate(nodes):
        edges = Dependency.objects.filter(job_id=job_ids[i])
        assert sorted(edges.values_list("parent_key", "on_parent_dead")) == sorted(
            (keys[p], node.mode) for p in node.parents
        ), f"n{i}'s edges"
        satisfied = {e.parent_key for e in edges if e.satisfied_at is not None}
        assert satisfied == {keys[p] for p in node.parents if finished(p)}, f"n{i}'s edges"


@pytest.mark.slow
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=int(os.environ.get("WORKFLOW_EXAMPLES", 30)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(nodes=dags(), data=st.data())
def test_random_dags_run_each_node_once_after_its_parents(nodes, data):
    clean()
    in_workflow = data.draw(st.integers(0, len(nodes)), label="in_workflow")
    results, keys = write(nodes, in_workflow)
    ids = [r.id for r in results]
    assert WorkflowStep.objects.count() == in_workflow
    testing.drain()

    # ---- what ran, died and waits, against the model
    outcome = expected_outcomes(nodes)
    letters = {letter.id: letter for letter in DeadLetter.objects.all()}
    live = {job.id: job for job in Job.objects.with_state()}
    for i, node in enumerate(nodes):
        label, expected = f"n{i}", outcome[i]
        marker = CompletionMarker.objects.filter(key=keys[i]).first()
        if expected == OK:
            assert marker is not None, f"{label} did not run"
            assert marker.result == {
                "label": label,
                "saw": {keys[p]: f"n{p}" for p in node.parents},
            }
            assert starts(label) == [0] * (1 + flaky_start(node)), label
            continue
        assert marker is None, f"{label} ran, expected {expected}"
        if expected == BLOCKED:
            job = live.get(ids[i])
            assert job is not None, f"{label} should be blocked, is {letters.get(ids[i])}"
            assert (job.state, job.locked_by, job.attempts) == (JobState.BLOCKED, None, 0)
            unfinished = sum(outcome[p] != OK for p in node.parents)
            assert job.waiting_for == unfinished, label
            assert starts(label) == []
            continue
        letter = letters.get(ids[i])
        assert letter is not None, f"{label} should be dead ({expected}), is {live.get(ids[i])}"
        if expected == PARENT_DEAD:
            assert letter.reason == DeadReason.PARENT_DEAD, label
            assert starts(label) == []
        else:
            reasons = {"fatal": DeadReason.FATAL, "error": DeadReason.ATTEMPTS_EXHAUSTED}
            assert letter.reason == reasons[node.fail], label
            assert starts(label) == ([] if node.atomic else [0])  # an atomic start rolls back
    assert set(live) == {ids[i] for i, o in enumerate(outcome) if o == BLOCKED}
    assert set(letters) == {ids[i] for i, o in enumerate(outcome) if o in (FAILED, PARENT_DEAD)}
    check_edges(nodes, ids, keys, lambda p: outcome[p] == OK)

    # ---- every letter replayed, its cause fixed, in any order: all runs, once each
    for i, node in enumerate(nodes):
        if node.fail in ("fatal", "error"):
            Audit.objects.create(label=f"heal|n{i}")
    dead = [i for i, o in enumerate(outcome) if o in (FAILED, PARENT_DEAD)]
    order = data.draw(st.permutations(dead), label="replay order")
    for i in order:
        report = DeadLetter.objects.filter(id=ids[i]).replay()
        assert list(report.replayed) == [ids[i]], f"n{i}: {report}"
        if data.draw(st.booleans(), label=f"drain after replaying n{i}"):
            testing.drain()
    testing.drain()
    assert Job.objects.count() == 0, list(Job.objects.with_state().values("name", "state"))
    assert DeadLetter.objects.pending().count() == 0
    final_ids = []
    for i, node in enumerate(nodes):
        label = f"n{i}"
        letter = DeadLetter.objects.filter(id=ids[i]).first()
        marker = CompletionMarker.objects.get(
            job_id=ids[i] if letter is None else letter.replay_job_id
        )
        if node.keyed or any(i in later.parents for later in nodes):
            # A replay keeps the key its dependents wait for (its old id, without a dedupe key).
            assert marker.key == keys[i], label
        final_ids.append(marker.job_id)
        assert marker.result == {"label": label, "saw": {keys[p]: f"n{p}" for p in node.parents}}
        ran_and_failed = outcome[i] == FAILED and not node.atomic
        assert starts(label) == [0] * (1 + ran_and_failed + flaky_start(node)), label
    check_edges(nodes, final_ids, keys, lambda p: True)
