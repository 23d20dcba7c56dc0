"""Workflows (issue 15) on real `runjobs` processes and a real database.

The kill storm runs on PostgreSQL only (with the chaos suite); the other tests run
on every engine, MariaDB's stage included.

Steps are tests/testapp/workflow_jobs.py's: each records its start on the database
clock and how many of its parents had no completion marker yet, and returns what
it saw in ctx.parent_results. Nothing here is timed: conditions are awaited with
generous deadlines, only so that a lost release fails instead of hanging.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter

import pytest
from django.db import transaction
from django.db.models import Max

from django_jobs import cancel_workflow, control, enqueue, workflow
from django_jobs.fleet import WorkerBeat
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    JobState,
    WorkflowStep,
)
from tests import workflow_model
from tests.conftest import CHAOS_LINES, POSTGRES, wait_for
from tests.testapp import jobs, workflow_jobs
from tests.testapp.models import Audit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def key_of(result, key=None):
    """The idempotency key of an enqueued job: its dedupe key, else its id as text."""
    return key if key is not None else str(result.id)


def starts(label):
    """The start records of a step: [(created_at on the database clock, parents missing)]."""
    rows = Audit.objects.filter(label__startswith=f"start|{label}|").order_by("pk")
    return [(row.created_at, int(row.label.rsplit("|", 1)[1])) for row in rows]


def marker(key):
    return CompletionMarker.objects.get(key=key)


def stop(workers):
    """SIGTERM each worker once it is up (a worker still booting dies of the signal), wait."""
    for worker in workers:
        wait_for(
            lambda w=worker: WorkerBeat.objects.filter(pid=w.pid).exists(),
            timeout=30,
            message=f"worker {worker.pid} to start",
        )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    codes = [worker.wait(timeout=30) for worker in workers]
    assert codes == [0] * len(workers), [w.output()[-2000:] for w in workers]


def assert_started_after_parents(label, parent_keys):
    """The step ran once, after every parent's marker existed (database clock, both sides)."""
    (started, missing), *again = starts(label)
    assert again == [], f"{label} ran more than once"
    assert missing == 0, f"{label} started with {missing} parent(s) unfinished"
    if not POSTGRES:
        return  # elsewhere a marker's completed_at is the worker's clock, not the database's
    for key in parent_keys:
        completed = marker(key).completed_at
        assert started > completed, f"{label} started at {started}, before {key} at {completed}"


# ---- 1. the diamond, three workers ----------------------------------------------


@pytest.mark.mariadb
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_diamonds_run_each_step_after_its_parents_markers_on_three_workers(worker_process, claim):
    if claim == "orm" and not POSTGRES:
        pytest.skip("needs PostgreSQL: elsewhere every claim is the ORM's")
    orders = 10
    steps = {}  # label -> (idempotency key, parents' keys)
    with transaction.atomic():
        for n in range(orders):
            # One middle step much slower than the other: an early release of ship would
            # start it while the slow one runs (threads enough that it would find one free).
            slow, fast = (0.8, 0.05) if n % 2 else (0.05, 0.8)
            with workflow(name=f"order-{n}") as w:
                charge = w.enqueue(
                    workflow_jobs.step, {"label": f"o{n}-charge", "sleep": 0.3}, key=f"o{n}-charge"
                )
                # Parents named every way the API takes: EnqueueResults, keys, ids, ids as text.
                first = [charge, f"o{n}-charge", charge.id][n % 3]
                reserve = w.enqueue(
                    workflow_jobs.step,
                    {"label": f"o{n}-reserve", "parents": [f"o{n}-charge"], "sleep": slow},
                    after=[first],
                    key=f"o{n}-reserve",
                )
                confirm = w.enqueue(
                    workflow_jobs.step_atomic,
                    {"label": f"o{n}-confirm", "parents": [f"o{n}-charge"], "sleep": fast},
                    after=[charge],
                )
                both = [f"o{n}-reserve", key_of(confirm)]
                w.enqueue(
                    workflow_jobs.step,
                    {"label": f"o{n}-ship", "parents": both, "full": True},
                    after=[[reserve, confirm], both, [reserve.id, str(confirm.id)]][n % 3],
                )
            steps[f"o{n}-charge"] = (f"o{n}-charge", [])
            steps[f"o{n}-reserve"] = (f"o{n}-reserve", [f"o{n}-charge"])
            steps[f"o{n}-confirm"] = (key_of(confirm), [f"o{n}-charge"])
            steps[f"o{n}-ship"] = (None, both)
    assert Job.objects.with_state().filter(state=JobState.BLOCKED).count() == 3 * orders
    env = {"JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim}), "JOBS_CONN_MAX_AGE": "60"}
    workers = [worker_process("--concurrency", "8", extra_env=env) for _ in range(3)]
    wait_for(
        lambda: CompletionMarker.objects.count() == 4 * orders,
        timeout=90,
        message="every step's marker",
    )
    stop(workers)
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    for label, (_key, parents) in steps.items():
        assert_started_after_parents(label, parents)
    for n in range(orders):
        charge, reserve = marker(f"o{n}-charge"), marker(f"o{n}-reserve")
        confirm = marker(steps[f"o{n}-confirm"][0])
        ship = CompletionMarker.objects.get(result__label=f"o{n}-ship")
        assert charge.result == {"label": f"o{n}-charge", "saw": {}}
        assert reserve.result["saw"] == {f"o{n}-charge": f"o{n}-charge"}
        assert confirm.result["saw"] == {f"o{n}-charge": f"o{n}-charge"}
        # What ship saw in ctx.parent_results: both parents' results, as their markers hold them.
        # reserve by its key, confirm (no key) by its handler's name.
        assert ship.result["saw"] == {reserve.key: reserve.result, confirm.name: confirm.result}
    assert WorkflowStep.objects.count() == 4 * orders
    assert set(WorkflowStep.objects.values_list("workflow", flat=True)) == {
        f"order-{n}" for n in range(orders)
    }
    assert Dependency.objects.count() == 4 * orders
    assert not Dependency.objects.filter(satisfied_at__isnull=True).exists()


# ---- 2. fan-out 1,000 -> fan-in 1 under a kill storm --------------------------------


@pytest.mark.postgres
@pytest.mark.chaos
@pytest.mark.parametrize("chunks", ["atomic", "plain"])
def test_fan_out_thousand_then_fan_in_survives_a_kill_storm(worker_process, chunks):
    handler = workflow_jobs.chunk if chunks == "atomic" else workflow_jobs.chunk_plain
    total, seconds, threads = 1000, 15.0, 3 * 4
    # Chunks long enough that the work spans the storm, so that kills land mid-chunk.
    ms = int(seconds * threads / total * 1000 * 0.9)
    keys = [f"storm-chunk-{i}" for i in range(total)]
    with transaction.atomic(), workflow(name="storm") as w:
        parents = [w.enqueue(handler, {"i": i, "ms": ms}, key=key) for i, key in enumerate(keys)]
        w.enqueue(
            workflow_jobs.fan_in,
            {"label": "fan-in", "parents": keys},
            after=parents,
            key="storm-fan-in",
        )
    # A short lease: a killed worker's chunks are rescued within a few seconds.
    args = ("--concurrency", "4", "--lease", "2")
    workers = [worker_process(*args) for _ in range(3)]
    started = time.monotonic()
    kills = 0
    rng = random.Random(15)
    while not CompletionMarker.objects.filter(key="storm-fan-in").exists():
        assert time.monotonic() - started < 240, "the storm did not end"
        time.sleep(2)
        victim = workers.pop(rng.randrange(len(workers)))
        victim.signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        workers.append(worker_process(*args))
    elapsed = time.monotonic() - started
    stop(workers)
    fan_in = marker("storm-fan-in")
    line = (
        f"CHAOS workflow-kill-storm ({chunks}): chunks={total} kills={kills} "
        f"max_attempts={CompletionMarker.objects.aggregate(m=Max('attempts'))['m']} "
        f"fan_in_attempts={fan_in.attempts} seconds={elapsed:.1f}"
    )
    print(line)
    CHAOS_LINES.append(line)
    assert kills >= 3
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    assert CompletionMarker.objects.count() == total + 1
    effects = Audit.objects.filter(label__startswith="chunk|")
    assert set(effects.values_list("label", flat=True)) == {f"chunk|{i}" for i in range(total)}
    if chunks == "atomic":
        assert effects.count() == total  # every chunk's effect exactly once
    # The fan-in ran once (atomic), after the last chunk's marker, and saw every result.
    last = CompletionMarker.objects.filter(key__in=keys).aggregate(m=Max("completed_at"))["m"]
    (fan_in_start, missing), *again = starts("fan-in")
    assert again == []
    assert missing == 0
    assert fan_in_start > last
    assert fan_in.result == {"parents": total, "sum": sum(range(total))}
    assert not Dependency.objects.filter(satisfied_at__isnull=True).exists()


# ---- 3. a dead parent: "wait" dependents block, "dead" ones die with it ---------------


@pytest.mark.mariadb
def test_dead_parents_block_wait_steps_and_kill_dead_steps_until_replayed(worker_process):
    def step(label, parents=(), mode="wait", **options):
        payload = {"label": label, "parents": [keys[p] for p in parents]}
        payload.update(options.pop("payload", {}))
        result = w.enqueue(
            workflow_jobs.step,
            payload,
            after=[results[p] for p in parents],
            on_parent_dead=mode,
            **options,
        )
        results[label], keys[label] = result, str(result.id)
        return result

    results, keys = {}, {}
    with transaction.atomic(), workflow(name="dead-parents") as w:
        step("fatal", payload={"fail": "fatal"})  # dead-lettered at once: FatalError
        step("exhausted", payload={"fail": "error"}, max_attempts=1)
        step("wait-1", ["fatal"])
        step("wait-2", ["wait-1"], mode="dead")  # its parent is blocked, not dead: blocked
        step("dead-1", ["fatal"], mode="dead")
        step("dead-1-dead", ["dead-1"], mode="dead")  # recursively
        step("dead-1-wait", ["dead-1"])
        step("mixed", ["exhausted", "wait-1"], mode="dead")  # one dead parent is enough
        step("both-wait", ["exhausted", "fatal"])
    blocked = ["wait-1", "wait-2", "dead-1-wait", "both-wait"]
    parent_dead = ["dead-1", "dead-1-dead", "mixed"]

    workers = [worker_process("--concurrency", "2") for _ in range(2)]
    letters = DeadLetter.objects.filter(id__in=[results[k].id for k in keys])
    wait_for(lambda: letters.count() == 5, timeout=60, message="the dead letters")
    reasons = {str(letter.id): letter.reason for letter in letters}
    assert reasons == {
        keys["fatal"]: DeadReason.FATAL,
        keys["exhausted"]: DeadReason.ATTEMPTS_EXHAUSTED,
        **{keys[label]: DeadReason.PARENT_DEAD for label in parent_dead},
    }
    # A few polls of both workers: each sentinel job is claimed and settled in turn, while
    # the blocked steps are there to be claimed if they were due.
    for i in range(6):
        sentinel = enqueue(jobs.record, {"label": f"sentinel-{i}"})
        wait_for(
            lambda s=sentinel: CompletionMarker.objects.filter(job_id=s.id).exists(),
            timeout=30,
            message="a sentinel job",
        )

    def assert_blocked(labels):
        rows = Job.objects.with_state().filter(id__in=[results[k].id for k in labels])
        assert sorted((str(j.id), j.state, j.locked_by, j.attempts) for j in rows) == sorted(
            (keys[k], JobState.BLOCKED, None, 0) for k in labels
        )
        for label in labels:
            assert starts(label) == [], f"{label} ran while blocked"

    assert_blocked(blocked)
    for label in parent_dead:
        assert starts(label) == [], f"{label} ran although its parent died"

    # The first root's letter replayed (its cause fixed): its "wait" dependents run, and
    # so does the dead-mode step behind them.
    Audit.objects.create(label="heal|fatal")
    report = control.replay(DeadLetter.objects.filter(id=results["fatal"].id))
    assert list(report.replayed) == [results["fatal"].id]
    for key in ("fatal", "wait-1", "wait-2"):
        wait_for(
            lambda k=key: CompletionMarker.objects.filter(key=keys[k]).exists(),
            timeout=30,
            message=f"{key} to run after the replay",
        )
    # Still blocked: what waits for the other root, or for a parent_dead step.
    assert_blocked(["dead-1-wait", "both-wait"])
    # A parent_dead step replayed once its parent has succeeded: it runs, and releases its
    # "wait" dependent; its own parent_dead dependent stays a letter until replayed too.
    control.replay(DeadLetter.objects.filter(id=results["dead-1"].id))
    wait_for(
        lambda: CompletionMarker.objects.filter(key=keys["dead-1-wait"]).exists(),
        timeout=30,
        message="dead-1-wait after dead-1's replay",
    )
    assert DeadLetter.objects.pending().filter(id=results["dead-1-dead"].id).exists()
    Audit.objects.create(label="heal|exhausted")
    control.replay(DeadLetter.objects.pending())  # exhausted, dead-1-dead, mixed
    wait_for(
        lambda: Job.objects.count() == 0 and CompletionMarker.objects.count() == 9 + 6,
        timeout=30,
        message="every step to finish",
    )
    stop(workers)
    assert DeadLetter.objects.pending().count() == 0
    for label, result in results.items():
        # A replayed leaf (no dependent waits for its key) finishes under its new id.
        letter = DeadLetter.objects.filter(id=result.id).first()
        done = CompletionMarker.objects.get(job_id=letter.replay_job_id if letter else result.id)
        assert done.result["label"] == label
        failed_once = label in ("fatal", "exhausted")
        assert [missing for _at, missing in starts(label)] == [0] * (1 + failed_once), label
    mixed = CompletionMarker.objects.get(result__label="mixed")
    # Two parents of one handler without keys: numbered in the order of after=.
    assert mixed.result["saw"] == {"tests.wf.step[0]": "exhausted", "tests.wf.step[1]": "wait-1"}
    assert not Dependency.objects.filter(satisfied_at__isnull=True).exists()


# ---- 4. dependents registered while their parents run ---------------------------------


@pytest.mark.mariadb
def test_children_enqueued_while_their_parents_run_are_each_released_once(worker_process):
    """The settle's fence: an edge committed after the parent's claim is still released."""
    rng = random.Random(4)
    total = 150
    with transaction.atomic():
        parents = [
            enqueue(
                workflow_jobs.step_atomic if i % 2 else workflow_jobs.step,
                {"label": f"p{i}", "sleep": rng.choice([0.1, 0.3, 0.8])},
            )
            for i in range(total)
        ]
    workers = [worker_process("--concurrency", "4") for _ in range(3)]
    wait_for(lambda: WorkerBeat.objects.count() == 3, timeout=30, message="the workers")
    states = Counter()
    for i in rng.sample(range(total), total):
        parent = parents[i]
        with transaction.atomic():
            row = Job.objects.filter(id=parent.id).values_list("locked_by").first()
            state = "done" if row is None else "waiting" if row[0] is None else "running"
            states[state] += 1
            enqueue(
                workflow_jobs.step,
                {"label": f"c{i}", "parents": [str(parent.id)]},
                after=[parent],
            )
            # Keep the parent's row locked a while (a running one, likely until it ends):
            # its settle meets an edge that commits after the settle statement began.
            time.sleep(rng.choice([0.1, 0.3, 0.6] if state == "running" else [0, 0, 0.02]))
    wait_for(
        lambda: CompletionMarker.objects.count() == 2 * total,
        timeout=90,
        message="every child released and run (a lost release leaves one blocked)",
    )
    stop(workers)
    line = "CHAOS workflow-late-dependents: " + " ".join(f"{k}={v}" for k, v in states.items())
    print(line)
    CHAOS_LINES.append(line)
    # The race this test is about happened: some children registered on running parents.
    assert states["running"] > 0, states
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0
    for i, parent in enumerate(parents):
        assert_started_after_parents(f"p{i}", [])
        assert_started_after_parents(f"c{i}", [str(parent.id)])
        child = CompletionMarker.objects.get(result__label=f"c{i}")
        handler = workflow_jobs.step_atomic if i % 2 else workflow_jobs.step
        assert child.result["saw"] == {handler.name: f"p{i}"}  # no key: by its handler
    assert not Dependency.objects.filter(satisfied_at__isnull=True).exists()


# ---- 5. a random DAG on three workers ------------------------------------------------------


@pytest.mark.mariadb
def test_a_random_dag_on_three_workers_ends_as_the_model_says(worker_process):
    """Releases, dead-letter cascades and replays racing one another across processes."""
    rng = random.Random(15)
    nodes = workflow_model.random_dag(rng, 300, max_parents=3)
    results, keys = workflow_model.write(nodes, 200, sleep=lambda i: rng.choice([0, 0, 0.01, 0.05]))
    ids = [r.id for r in results]
    outcome = workflow_model.expected_outcomes(nodes)
    markers, letters = workflow_model.settled(outcome)
    workers = [worker_process("--concurrency", "4") for _ in range(3)]
    wait_for(
        lambda: (
            CompletionMarker.objects.count() >= markers and DeadLetter.objects.count() >= letters
        ),
        timeout=90,
        message=f"{markers} markers and {letters} letters",
    )
    # A few more polls of every worker: nothing else is due.
    for i in range(6):
        sentinel = enqueue(jobs.record, {"label": f"sentinel-{i}"})
        wait_for(
            lambda s=sentinel: CompletionMarker.objects.filter(job_id=s.id).exists(),
            timeout=30,
            message="a sentinel job",
        )
    CompletionMarker.objects.filter(name=jobs.record.name).delete()
    workflow_model.check_outcomes(nodes, ids, keys, outcome)
    # Every letter replayed, its cause fixed, in random order while the workers run.
    workflow_model.heal(nodes)
    for i in rng.sample(
        workflow_model.dead_nodes(outcome), len(workflow_model.dead_nodes(outcome))
    ):
        workflow_model.replay(ids, i)
        time.sleep(rng.choice([0, 0, 0.02]))
    wait_for(
        lambda: CompletionMarker.objects.count() == len(nodes) and not Job.objects.exists(),
        timeout=90,
        message="every node to run",
    )
    stop(workers)
    workflow_model.check_all_ran(nodes, ids, keys, outcome)


# ---- 6. cancel_workflow while a step runs -------------------------------------------------


@pytest.mark.mariadb
def test_cancel_workflow_stops_its_running_step_and_buries_dead_dependents(worker_process):
    with transaction.atomic():
        with workflow(name="cancelled") as w:
            running = w.enqueue(jobs.until_cancelled, {"label": "running", "seconds": 60})
            step = w.enqueue(workflow_jobs.step, {"label": "in-workflow"}, after=[running])
        dead = enqueue(
            workflow_jobs.step, {"label": "dead-mode"}, after=[running], on_parent_dead="dead"
        )
        waits = enqueue(workflow_jobs.step, {"label": "wait-mode"}, after=[running])
    # A short lease: the heartbeat (lease / 3) carries the cancel request to the worker.
    workers = [worker_process("--concurrency", "2", "--lease", "3")]
    wait_for(lambda: Audit.objects.filter(label="start-running").exists(), message="the step")
    result = cancel_workflow("cancelled")
    assert (result.cancelled, result.requested) == (1, 1)
    wait_for(
        lambda: DeadLetter.objects.filter(id=running.id).exists(),
        timeout=30,
        message="the running step to stop",
    )
    letters = dict(DeadLetter.objects.values_list("id", "reason"))
    assert letters == {
        running.id: DeadReason.CANCELLED,
        step.id: DeadReason.CANCELLED,
        dead.id: DeadReason.PARENT_DEAD,
    }
    # The "wait" dependent outside the workflow waits for a replay of the cancelled step.
    assert list(Job.objects.with_state().values_list("id", "state")) == [
        (waits.id, JobState.BLOCKED)
    ]
    stop(workers)
    assert not Audit.objects.filter(label__startswith="start|").exists()
