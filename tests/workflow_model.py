"""A model of docs/workflows.md for random DAGs of workflow steps, and its checks.

A node's parents are earlier nodes; some nodes fail; each says what it does when a
parent dies (on_parent_dead). tests/test_workflow_property.py drains such DAGs
in-process, tests/test_workflow_processes.py on real workers; both check the
outcome here, then replay every letter and check that everything ran once.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from django.db import transaction

from django_jobs import control, enqueue, workflow
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    JobState,
)
from tests.testapp import workflow_jobs
from tests.testapp.models import Audit

OK, FAILED, PARENT_DEAD, BLOCKED = "ok", "failed", "parent_dead", "blocked"
MODES = ("wait", "dead")
# None; "fatal" (FatalError) or "error" (RuntimeError with max_attempts=1): dead-lettered;
# "flaky": its first attempt fails, its retry succeeds.
FAILURES = (None,) * 5 + ("fatal", "error", "flaky")
REFS = ("result", "id", "text")


@dataclass(frozen=True)
class Node:
    parents: tuple[int, ...]
    mode: str  # on_parent_dead
    fail: str | None
    keyed: bool  # a dedupe key, or its id as idempotency key
    atomic: bool
    ref: str  # how its dependents name it in after=: "result", "id" or "text"
    twice: bool  # its dependents name it twice (by ref and by id): still one edge


def random_dag(rng: random.Random, size: int, max_parents: int = 4) -> list[Node]:
    return [
        Node(
            parents=tuple(sorted(rng.sample(range(i), rng.randint(0, min(i, max_parents))))),
            mode=rng.choice(MODES),
            fail=rng.choice(FAILURES),
            keyed=rng.random() < 0.5,
            atomic=rng.random() < 0.5,
            ref=rng.choice(REFS),
            twice=rng.random() < 0.5,
        )
        for i in range(size)
    ]


def starts(label):
    """The parents-missing count of each start of a step, in order."""
    rows = Audit.objects.filter(label__startswith=f"start|{label}|").order_by("pk")
    return [int(label.rsplit("|", 1)[1]) for label in rows.values_list("label", flat=True)]


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


def write(nodes, in_workflow, sleep=None):
    """Write nodes [0, in_workflow) as one workflow, the rest by enqueue(after=), in one commit.

    Return their EnqueueResults and idempotency keys. `sleep(i)`: node i's handler
    sleeps that long.
    """
    results, keys = [], []

    def named(j):
        return {"result": results[j], "id": results[j].id, "text": keys[j]}[nodes[j].ref]

    def one(i, enqueue_function):
        node = nodes[i]
        handler = workflow_jobs.step_atomic if node.atomic else workflow_jobs.step
        payload = {"label": f"n{i}", "parents": [keys[p] for p in node.parents], "fail": node.fail}
        if sleep is not None:
            payload["sleep"] = sleep(i)
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


def expected_saw(nodes, node, keys):
    """What a node saw in ctx.parent_results (docs/workflows.md): labels by key or name."""
    names = {
        p: workflow_jobs.step_atomic.name if nodes[p].atomic else workflow_jobs.step.name
        for p in node.parents
        if not nodes[p].keyed
    }
    shared, seen, saw = Counter(names.values()), Counter(), {}
    for p in node.parents:  # the order of after=
        if nodes[p].keyed:
            saw[keys[p]] = f"n{p}"
        elif shared[names[p]] == 1:
            saw[names[p]] = f"n{p}"
        else:
            saw[f"{names[p]}[{seen[names[p]]}]"] = f"n{p}"
            seen[names[p]] += 1
    return saw


def settled(outcome):
    """How many markers and letters the model expects once everything due has run."""
    return outcome.count(OK), outcome.count(FAILED) + outcome.count(PARENT_DEAD)


def check_outcomes(nodes, ids, keys, outcome):
    """What ran, died and waits, against the model."""
    letters = {letter.id: letter for letter in DeadLetter.objects.all()}
    live = {job.id: job for job in Job.objects.with_state()}
    for i, node in enumerate(nodes):
        label, expected = f"n{i}", outcome[i]
        marker = CompletionMarker.objects.filter(key=keys[i]).first()
        if expected == OK:
            assert marker is not None, f"{label} did not run"
            assert marker.result == {
                "label": label,
                "saw": expected_saw(nodes, node, keys),
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


def heal(nodes):
    """Fix the cause of every failing node: their replays succeed."""
    for i, node in enumerate(nodes):
        if node.fail in ("fatal", "error"):
            Audit.objects.create(label=f"heal|n{i}")


def dead_nodes(outcome):
    return [i for i, o in enumerate(outcome) if o in (FAILED, PARENT_DEAD)]


def replay(ids, i):
    report = control.replay(DeadLetter.objects.filter(id=ids[i]))
    assert list(report.replayed) == [ids[i]], f"n{i}: {report}"


def check_all_ran(nodes, ids, keys, outcome):
    """After every letter's replay: each node ran once (more if it failed), after its parents."""
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
        assert marker.result == {"label": label, "saw": expected_saw(nodes, node, keys)}
        ran_and_failed = outcome[i] == FAILED and not node.atomic
        assert starts(label) == [0] * (1 + ran_and_failed + flaky_start(node)), label
    check_edges(nodes, final_ids, keys, lambda p: True)
