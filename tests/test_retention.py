"""Retention: old markers and dead letters are pruned in small batches.

Workers prune them, and so does prunejobs.
"""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobs import control, enqueue, retention, workflow
from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job, WorkflowStep
from django_jobs.rows import uuid7
from django_jobs.testing import drain
from tests.conftest import wait_for
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


def _markers(n, age, **fields):
    at = timezone.now() - age
    return [MarkerFactory(completed_at=at, enqueued_at=at, **fields) for _ in range(n)]


def test_prune_deletes_old_markers_in_batches_and_keeps_young_ones():
    old = _markers(25, 8 * DAY)
    young = _markers(5, 6 * DAY)
    first = retention.prune_batch(batch=10)  # KEEP_MARKERS defaults to 7 days
    assert first.markers == 10
    # The oldest go first.
    remaining = set(CompletionMarker.objects.values_list("job_id", flat=True))
    assert len(remaining) == 20
    rest = retention.prune(batch=10)
    assert (rest.markers, rest.batches) == (15, 3)  # markers 10 + 5, dead letters 0 (then done)
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == {
        m.job_id for m in young
    }
    assert not CompletionMarker.objects.filter(job_id__in=[m.job_id for m in old]).exists()


def test_the_marker_of_a_key_with_a_live_job_is_never_pruned():
    keyed = MarkerFactory(key="invoice-7", completed_at=timezone.now() - 30 * DAY)
    JobFactory(key="invoice-7")  # a live job holds the key
    unkeyed = MarkerFactory(completed_at=timezone.now() - 30 * DAY)
    JobFactory(id=unkeyed.job_id)  # the very job the marker records is live (it is settling)
    free = MarkerFactory(key="invoice-8", completed_at=timezone.now() - 30 * DAY)
    assert retention.count_prunable().markers == 1
    result = retention.prune(batch=1)
    assert result.markers == 1
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == {
        keyed.job_id,
        unkeyed.job_id,
    }
    assert not CompletionMarker.objects.filter(job_id=free.job_id).exists()


def test_dead_letters_are_pruned_by_age():
    old = [DeadLetterFactory(dead_at=timezone.now() - 31 * DAY) for _ in range(3)]
    young = DeadLetterFactory(dead_at=timezone.now() - 29 * DAY)
    result = retention.prune(batch=2)
    assert result.dead_letters == 3
    assert list(DeadLetter.objects.values_list("id", flat=True)) == [young.id]
    assert not DeadLetter.objects.filter(id__in=[d.id for d in old]).exists()


def test_none_keeps_everything():
    _markers(3, 400 * DAY)
    DeadLetterFactory(dead_at=timezone.now() - 400 * DAY)
    with override_settings(DJANGO_JOBS={"KEEP_MARKERS": None, "KEEP_DEAD_LETTERS": None}):
        assert retention.prune() == retention.PruneResult()
    assert CompletionMarker.objects.count() == 3 and DeadLetter.objects.count() == 1


def test_prunejobs_dry_run_counts_and_deletes_nothing(capsys):
    _markers(4, 8 * DAY)
    _markers(2, DAY)
    DeadLetterFactory(dead_at=timezone.now() - 40 * DAY)
    call_command("prunejobs", "--dry-run")
    assert "would delete 4 completion marker(s), 1 dead letter(s), " in capsys.readouterr().out
    assert (CompletionMarker.objects.count(), DeadLetter.objects.count()) == (6, 1)
    call_command("prunejobs", "--markers", "12h", "--dead-letters", "none", "--batch", "3")
    assert "deleted 6 completion marker(s), 0 dead letter(s), " in capsys.readouterr().out
    assert (CompletionMarker.objects.count(), DeadLetter.objects.count()) == (0, 1)


def _finished_workflows():
    """Workflows whose records are partly prunable; return the steps whose rows must stay."""
    old = timezone.now() - 40 * DAY  # past KEEP_MARKERS (7 days) and KEEP_DEAD_LETTERS (30)
    with workflow(name="done") as w:  # fan-out and fan-in: 4 markers, 4 edges, 4 steps
        a = w.enqueue("tests.noop")
        b = w.enqueue("tests.noop", after=[a])
        c = w.enqueue("tests.noop", after=[a])
        w.enqueue("tests.noop", after=[b, c])
    with workflow(name="half") as w:
        first = w.enqueue("tests.noop")  # old marker: its step row goes (it has no edge)
        second = w.enqueue("tests.noop", after=[first])  # young marker: its edge and row stay
    drain()
    DeadLetterFactory(key="gone")  # a letter without workflow rows
    with workflow(name="died") as w:
        x = w.enqueue("tests.noop", after=["gone"], on_parent_dead="dead")
        y = w.enqueue("tests.noop", after=[x], on_parent_dead="dead")  # letter, edge, row go
        z = w.enqueue("tests.noop", after=[x])  # blocked on x: x's letter and rows stay
    assert set(DeadLetter.objects.values_list("id", flat=True)) >= {x.id, y.id}
    # A job with two records, an old letter and a young marker: its rows stay with the marker.
    both = DeadLetterFactory().id
    MarkerFactory(job_id=both)
    WorkflowStep.objects.create(
        job_id=both, workflow="both", name="tests.noop", created_at=timezone.now()
    )
    Dependency.objects.create(
        job_id=both, parent_key="p", parent_id=uuid7(), created_at=timezone.now()
    )
    CompletionMarker.objects.exclude(job_id__in=[second.id, both]).update(completed_at=old)
    DeadLetter.objects.update(dead_at=old)
    return {x.id, z.id, second.id, both}


@pytest.mark.parametrize("batch", ["1", "500"])
def test_prunejobs_dry_run_counts_the_workflow_rows_the_real_run_deletes(capsys, batch):
    staying = _finished_workflows()
    tables = (CompletionMarker, DeadLetter, Dependency, WorkflowStep)
    before = [model.objects.count() for model in tables]
    # Markers: done's 4 and half's first; letters: y and both's (gone stays: x's
    # pending letter, which z waits for, names it).
    figures = (
        "5 completion marker(s), 2 dead letter(s), 5 workflow dependency edge(s) "
        "and 6 workflow step row(s)"
    )

    call_command("prunejobs", "--dry-run")
    assert capsys.readouterr().out == f"would delete {figures}\n"
    assert [model.objects.count() for model in tables] == before

    call_command("prunejobs", "--batch", batch)
    assert capsys.readouterr().out.startswith(f"deleted {figures} in ")
    after = [model.objects.count() for model in tables]
    assert [b - a for b, a in zip(before, after, strict=True)] == [5, 2, 5, 6]
    assert set(WorkflowStep.objects.values_list("job_id", flat=True)) == staying
    assert set(Dependency.objects.values_list("job_id", flat=True)) == staying

    call_command("prunejobs", "--dry-run")
    assert capsys.readouterr().out == (
        "would delete 0 completion marker(s), 0 dead letter(s), 0 workflow dependency edge(s) "
        "and 0 workflow step row(s)\n"
    )


def test_prunejobs_dry_run_leaves_out_the_workflow_rows_of_a_table_kept(capsys):
    _finished_workflows()
    call_command("prunejobs", "--dry-run", "--dead-letters", "none")
    # Markers alone: done's and half's first (both's marker is young).
    assert capsys.readouterr().out == (
        "would delete 5 completion marker(s), 0 dead letter(s), 4 workflow dependency edge(s) "
        "and 5 workflow step row(s)\n"
    )
    call_command("prunejobs", "--dead-letters", "none")
    assert capsys.readouterr().out.startswith(
        "deleted 5 completion marker(s), 0 dead letter(s), 4 workflow dependency edge(s) "
        "and 5 workflow step row(s) in "
    )


@pytest.mark.parametrize(
    "argv", [["--markers", "soon"], ["--dead-letters", "-3d"], ["--batch", "0"]]
)
def test_prunejobs_refuses_bad_input(argv):
    _markers(2, 8 * DAY)
    with pytest.raises(CommandError, match=f"argument {argv[0]}"):  # refused for this option
        call_command("prunejobs", *argv)
    assert CompletionMarker.objects.count() == 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("12h", 43200), ("90m", 5400), ("45", 45), ("2w", 1209600), ("0s", 0)],
)
def test_durations(text, seconds):
    assert retention.as_timedelta(text) == timedelta(seconds=seconds)
    assert retention.as_timedelta("none") is None


@pytest.mark.slow
def test_workers_prune_by_themselves_in_batches(worker_process):
    for i in range(40):
        enqueue(jobs.record, {"label": f"r{i}"})
    DeadLetterFactory(dead_at=timezone.now() - 40 * DAY)
    young_letter = DeadLetterFactory()
    env = {
        "JOBS_TEST_SETTINGS": json.dumps(
            {"KEEP_MARKERS": 1, "PRUNE_BATCH": 7, "MAINTENANCE_INTERVAL": 0.3, "WORKER_EXPIRY": 5}
        ),
        "JOBS_LOG_LEVEL": "INFO",
    }
    worker = worker_process("--concurrency", "2", extra_env=env)
    wait_for(lambda: Job.objects.count() == 0, message="the jobs to run")
    wait_for(
        lambda: CompletionMarker.objects.count() == 0,
        timeout=20,
        message="the markers to be pruned",
    )
    assert list(DeadLetter.objects.values_list("id", flat=True)) == [young_letter.id]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert "pruned" in worker.output()


@pytest.mark.postgres
@pytest.mark.slow
def test_jobs_table_and_its_indexes_do_not_grow_as_jobs_go_through(run_worker):
    """Finished jobs leave the hot table: its size follows the backlog, not the jobs gone through.

    VACUUM stands in for autovacuum here (the test is shorter than its naptime);
    bench/table_sizes.py shows the same over 1,000,000 jobs with autovacuum alone.
    The heap must stay empty between rounds, and the index pages in use (from
    pgstattuple's pgstatindex) must not grow. The index *files* may keep a few
    pages more: btree pages emptied by deletions are only reused once no older
    transaction is open anywhere on the server, which other databases' sessions
    can delay; those pages are counted as deleted, not in use.
    """
    rounds, per_round = 20, 1000
    indexes = [
        "django_jobs_job_pkey",
        "django_jobs_job_claim",
        "django_jobs_job_lease",
        "django_jobs_job_key_unique",
    ]
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")

    def size():
        with connection.cursor() as cursor:
            cursor.execute("VACUUM django_jobs_job")
            cursor.execute(
                "SELECT pg_relation_size('django_jobs_job'), pg_indexes_size('django_jobs_job')"
            )
            heap, files = cursor.fetchone()
            in_use = 0
            for name in indexes:
                cursor.execute(
                    "SELECT internal_pages + leaf_pages + 1 FROM pgstatindex(%s)", [name]
                )
                in_use += cursor.fetchone()[0]
            return heap, files, in_use

    sizes = []
    for _ in range(rounds):
        Job.objects.bulk_create(JobFactory.build(name="tests.noop") for _ in range(per_round))
        run_worker(concurrency=4, batch=200)
        assert Job.objects.count() == 0
        sizes.append(size())
    print(
        f"\ndjango_jobs_job after each of {rounds} rounds of {per_round} jobs "
        f"(heap bytes, index file bytes, index pages in use): {sizes}"
    )
    start, end = sizes[0], sizes[-1]
    assert end[0] <= start[0]  # the heap: empty
    assert end[2] <= start[2], sizes  # the index pages in use


# ---- workflows: what a waiting job still needs is kept ----------------------------------------


def test_a_dead_parents_letter_stays_while_a_dead_letter_waits_for_it():
    old = timezone.now() - 400 * DAY
    keyed = enqueue("tests.fatal", key="pk")
    keyless = enqueue("tests.fatal")
    drain()
    # Enqueued after their parents died, both children go straight to the letters.
    child = enqueue("tests.record", {"label": "child"}, after=["pk"], on_parent_dead="dead")
    other = enqueue("tests.record", {"label": "other"}, after=[keyless.id], on_parent_dead="dead")
    assert set(DeadLetter.objects.filter(reason="parent_dead").values_list("id", flat=True)) == {
        child.id,
        other.id,
    }
    DeadLetter.objects.filter(id__in=[keyed.id, keyless.id]).update(dead_at=old)

    assert retention.count_prunable(keep_markers=None).dead_letters == 0
    assert retention.prune(keep_markers=None).dead_letters == 0

    # The replayed child finds its parent's letter and waits for it instead of running.
    report = control.replay(DeadLetter.objects.filter(id=child.id))
    drain()
    assert not Audit.objects.filter(label="child").exists()
    assert Job.objects.get(id=report.replayed[child.id]).waiting_for == 1
    # Once the waiting letter is pruned (its edge with it), its parent's letter follows.
    DeadLetter.objects.filter(id=other.id).update(dead_at=old)
    assert retention.prune(keep_markers=None).dead_letters == 1
    assert DeadLetter.objects.filter(id=keyless.id).exists()
    assert retention.count_prunable(keep_markers=None).dead_letters == 1
    assert retention.prune(keep_markers=None).dead_letters == 1
    assert set(DeadLetter.objects.values_list("id", flat=True)) == {keyed.id, child.id}


@pytest.mark.parametrize("dead", ["wait", "dead"])
def test_a_parents_marker_stays_while_its_child_waits(dead):
    enqueue("tests.noop", key="p1")
    DeadLetterFactory(key="p2")  # the other parent is dead: the child waits, or dies too
    drain()
    child = enqueue("tests.bb.step", {"label": "c"}, after=["p1", "p2"], on_parent_dead=dead)
    CompletionMarker.objects.update(completed_at=timezone.now() - 400 * DAY)

    assert retention.count_prunable(keep_dead_letters=None).markers == 0
    assert retention.prune(keep_dead_letters=None).markers == 0

    control.replay(DeadLetter.objects.filter(key="p2"))
    drain()
    control.replay(DeadLetter.objects.filter(id=child.id))  # nothing to replay for a waiting child
    drain()
    [done] = CompletionMarker.objects.filter(name="tests.bb.step")
    assert set(done.result["saw"]) == {"p1", "p2"}
    # With the child done, nothing waits for the markers any more.
    CompletionMarker.objects.update(completed_at=timezone.now() - 400 * DAY)
    assert retention.count_prunable(keep_dead_letters=None).markers == 3


def test_a_replayed_steps_row_stays_with_its_replay_when_its_letter_goes():
    """A replay moves the step's row to its job: pruning the old letter leaves the step."""
    with workflow(name="again") as w:
        died = w.enqueue("tests.fatal_runs", {"label": "again", "fails": 1})
    drain()
    replay = control.replay(DeadLetter.objects.filter(id=died.id)).replayed[died.id]
    drain()
    assert CompletionMarker.objects.filter(job_id=replay).exists()
    DeadLetter.objects.update(dead_at=timezone.now() - 40 * DAY)
    counted = retention.count_prunable()
    result = retention.prune()
    assert (result.dead_letters, result.workflow_steps) == (1, 0)
    assert (counted.dead_letters, counted.workflow_steps) == (1, 0)
    assert list(WorkflowStep.objects.values_list("job_id", flat=True)) == [replay]
