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

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_jobs import enqueue, testing, workflow
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Dependency,
    Job,
    JobState,
    WorkflowStep,
)
from django_jobs.store import JobStore
from tests.testapp import workflow_jobs
from tests.testapp.models import Audit
from tests.workflow_model import (
    FAILURES,
    MODES,
    REFS,
    Node,
    check_all_ran,
    check_outcomes,
    dead_nodes,
    expected_outcomes,
    heal,
    replay,
    starts,
    write,
)


class Boom(Exception):
    pass


def clean():
    for model in (Job, Dependency, WorkflowStep, CompletionMarker, DeadLetter, Audit):
        model.objects.all().delete()


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
    assert JobStore().run_now(Job.objects.all()) == 0
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


@st.composite
def dags(draw):
    size = draw(st.integers(1, MAX_NODES))
    nodes = []
    for i in range(size):
        parents = draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4))) if i else set()
        nodes.append(
            Node(
                parents=tuple(sorted(parents)),
                mode=draw(st.sampled_from(MODES)),
                fail=draw(st.sampled_from(FAILURES)),
                keyed=draw(st.booleans()),
                atomic=draw(st.booleans()),
                ref=draw(st.sampled_from(REFS)),
                twice=draw(st.booleans()),
            )
        )
    return nodes


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
    outcome = expected_outcomes(nodes)
    check_outcomes(nodes, ids, keys, outcome)

    # Every letter replayed, its cause fixed, in any order: all runs, once each.
    heal(nodes)
    for i in data.draw(st.permutations(dead_nodes(outcome)), label="replay order"):
        replay(ids, i)
        if data.draw(st.booleans(), label=f"drain after replaying n{i}"):
            testing.drain()
    testing.drain()
    check_all_ran(nodes, ids, keys, outcome)
