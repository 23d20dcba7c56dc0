"""Operators' state changes: replay dead letters, make scheduled jobs due (cancel: test_cancel)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import control, enqueue
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    WorkflowStep,
    blocked_until,
)
from django_jobs.rows import uuid7
from django_jobs.store import JobStore
from django_jobs.store.engine import engine
from tests.conftest import ENGINE
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db


def test_replay_makes_one_fresh_job_with_the_letters_work():
    letter = DeadLetterFactory(
        name="tests.record",
        queue="emails",
        priority=7,
        key="k-1",
        payload='{"label": "again", "b": 1}',
        attempts=3,
        max_attempts=4,
    )
    report = control.replay(DeadLetter.objects.filter(pk=letter.pk), by="ada")

    assert str(report) == "1 replayed"
    job = Job.objects.get()
    assert report.replayed == {letter.id: job.id}
    assert job.id != letter.id
    assert (job.name, job.queue, job.priority, job.key, job.payload) == (
        "tests.record",
        "emails",
        7,
        "k-1",
        '{"label": "again", "b": 1}',
    )
    assert job.attempts == 0 and job.max_attempts == 4 and job.errors == []
    assert job.locked_by is None and job.run_at <= timezone.now()
    letter.refresh_from_db()
    assert letter.replay_job_id == job.id
    assert letter.replayed_by == "ada"
    assert letter.replayed_at is not None


def test_replaying_a_replayed_letter_makes_no_second_job():
    letter = DeadLetterFactory()
    first = control.replay(DeadLetter.objects.filter(pk=letter.pk), by="ada")
    second = control.replay(DeadLetter.objects.filter(pk=letter.pk), by="bob")

    assert len(first.replayed) == 1
    assert str(second) == "0 replayed, 1 already replayed"
    assert Job.objects.count() == 1
    letter.refresh_from_db()
    assert letter.replayed_by == "ada"


@pytest.mark.pgbouncer
@pytest.mark.django_db(transaction=True)
def test_the_replayed_job_runs_and_leaves_its_marker(run_worker):
    letter = DeadLetterFactory(name="tests.record", payload='{"label": "second life"}')
    job_id = control.replay(DeadLetter.objects.filter(pk=letter.pk)).replayed[letter.id]

    run_worker()

    assert Audit.objects.get().label == "second life"
    marker = CompletionMarker.objects.get(job_id=job_id)
    assert marker.attempts == 1
    assert not Job.objects.exists()


def test_a_letter_whose_key_a_live_job_holds_is_not_replayed():
    enqueue("tests.record", {"label": "new"}, key="shared")
    letter = DeadLetterFactory(key="shared", payload='{"label": "old"}')

    report = control.replay(DeadLetter.objects.filter(pk=letter.pk))

    assert report.key_taken == [letter.id]
    assert "whose key a live job holds" in str(report)
    assert Job.objects.count() == 1
    letter.refresh_from_db()
    assert letter.replayed_at is None and letter.replay_job_id is None


def test_a_letter_whose_key_completed_since_is_not_replayed():
    letter = DeadLetterFactory(key="done-key")
    MarkerFactory(key="done-key")

    report = control.replay(DeadLetter.objects.filter(pk=letter.pk))

    assert report.completed == [letter.id]
    assert not Job.objects.exists()
    letter.refresh_from_db()
    assert letter.replayed_at is None


def test_a_letter_with_no_registered_handler_is_not_replayed():
    letter = DeadLetterFactory(name="os.system", reason=DeadReason.UNKNOWN_NAME)

    report = control.replay(DeadLetter.objects.filter(pk=letter.pk))

    assert report.unknown == [letter.id]
    assert not Job.objects.exists()


def test_replay_later_schedules_the_job():
    letters = DeadLetterFactory.create_batch(2)
    at = timezone.now() + timedelta(hours=2)
    control.replay(DeadLetter.objects.filter(pk=letters[0].pk), run_at=at)
    control.replay(DeadLetter.objects.filter(pk=letters[1].pk), delay=600)

    later = Job.objects.get(id=DeadLetter.objects.get(pk=letters[0].pk).replay_job_id)
    assert later.run_at == at
    delayed = Job.objects.get(id=DeadLetter.objects.get(pk=letters[1].pk).replay_job_id)
    assert timedelta(seconds=590) < delayed.run_at - timezone.now() <= timedelta(seconds=600)
    assert Job.objects.scheduled().count() == 2
    with pytest.raises(ValueError, match="run_at or delay"):
        control.replay(DeadLetter.objects.all(), run_at=at, delay=1)
    with pytest.raises(ValueError, match="delay must be a number of seconds from 0"):
        control.replay(DeadLetter.objects.all(), delay=-1)


def test_bulk_replay_reports_each_outcome_and_progress(settings):
    fresh = DeadLetterFactory.create_batch(5)
    replayed = DeadLetterFactory(replayed_at=timezone.now(), replay_job_id=fresh[0].id)
    seen = []

    report = control.replay(
        DeadLetter.objects.all(), by="ops", progress=lambda done, total: seen.append((done, total))
    )

    assert str(report) == "5 replayed, 1 already replayed"
    assert report.already == [replayed.id]
    assert seen[-1] == (6, 6)
    assert Job.objects.count() == 5


def test_two_concurrent_replays_of_one_letter_make_one_job(transactional_db, monkeypatch):
    """Two browser tabs: the second replay waits for the first's row lock, then does nothing."""
    letter = DeadLetterFactory()
    inside = threading.Event()
    release = threading.Event()
    reports = {}
    engine_class = type(engine(DeadLetter.objects.db))  # its insert_replays, this database's
    original_insert = engine_class.insert_replays

    def slow_insert(self, *args, **kwargs):
        if threading.current_thread().name == "tab-1":
            inside.set()
            release.wait(10)  # hold the letter's row lock inside the first replay's transaction
        return original_insert(self, *args, **kwargs)

    monkeypatch.setattr(engine_class, "insert_replays", slow_insert)

    def tab(name):
        try:
            reports[name] = control.replay(DeadLetter.objects.filter(pk=letter.pk), by=name)
        finally:
            connections.close_all()

    first = threading.Thread(target=tab, args=("tab-1",), name="tab-1")
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=tab, args=("tab-2",), name="tab-2")
    second.start()
    time.sleep(0.3)  # the second tab is now blocked on the first's lock
    assert "tab-2" not in reports
    release.set()
    first.join(20)
    second.join(20)

    assert len(reports["tab-1"].replayed) == 1
    assert reports["tab-2"].already == [letter.id] and not reports["tab-2"].replayed
    assert Job.objects.count() == 1
    assert DeadLetter.objects.get().replayed_by == "tab-1"


@pytest.mark.pgbouncer
@pytest.mark.postgres
def test_racing_replays_of_many_letters_make_one_job_each(transactional_db):
    letters = DeadLetterFactory.create_batch(30)
    barrier = threading.Barrier(3)
    reports = []

    def replay():
        try:
            barrier.wait(10)
            reports.append(
                control.replay(DeadLetter.objects.all(), by=threading.current_thread().name)
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=replay) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sum(len(r.replayed) for r in reports) == 30
    assert sum(len(r.already) for r in reports) == 60
    assert Job.objects.count() == 30
    assert set(DeadLetter.objects.values_list("replay_job_id", flat=True)) == set(
        Job.objects.values_list("id", flat=True)
    )
    assert len(letters) == 30


@pytest.mark.postgres
def test_replay_wakes_listening_workers_of_the_queue(transactional_db):
    import psycopg

    letter = DeadLetterFactory(queue="emails")
    params = connection.get_connection_params()
    with psycopg.connect(
        host=params.get("host"),
        port=params.get("port"),
        user=params.get("user"),
        password=params.get("password") or None,
        dbname=params["dbname"],
        autocommit=True,
    ) as listener:
        listener.execute("LISTEN django_jobs")
        control.replay(DeadLetter.objects.filter(pk=letter.pk))
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


# ---- replay in bulk: statements per batch, keys that change hands -------------

# What a batch of replayed letters may cost at most, savepoints included: a few
# statements, none per letter (PostgreSQL needs fewer than SQLite and MariaDB).
STATEMENTS_PER_BATCH = 14
# With edges, and letters that jobs wait for: four more for the walk down from the
# batch's keys that refuses a replay closing a cycle (one level of waiters here).
STATEMENTS_PER_BATCH_WITH_EDGES = 26


def bulk_letters(count, *, edges):
    """Write count letters of tests.noop (every other one keyed); return their ids.

    With edges, each letter is a workflow step that waits for four parents of its
    own (a live job, a finished one, a pending letter, and a letter replayed as a
    live job), and a blocked live job waits for it.
    """
    now = timezone.now()
    letters = [
        DeadLetter(
            id=uuid7(),
            name="tests.noop",
            queue="default",
            payload=f'{{"i": {i}}}',
            key=f"bulk-{uuid7()}" if i % 2 else None,
            attempts=3,
            max_attempts=3,
            reason=DeadReason.ATTEMPTS_EXHAUSTED,
            error="builtins.RuntimeError: boom",
            enqueued_at=now,
            dead_at=now,
        )
        for i in range(count)
    ]
    DeadLetter.objects.bulk_create(letters)
    if edges:
        rows = []
        for letter in letters:
            live = JobFactory()
            done = MarkerFactory()
            pending = DeadLetterFactory()
            replayed_as = JobFactory()
            replayed = DeadLetterFactory(replayed_at=now, replay_job_id=replayed_as.id)
            waiter = JobFactory(waiting_for=1, run_at=blocked_until())
            key = letter.key if letter.key is not None else str(letter.id)
            rows.append(Dependency(job_id=waiter.id, parent_key=key, parent_id=letter.id))
            for parent_key, parent_id in (
                (str(live.id), live.id),
                (done.key, done.job_id),
                (str(pending.id), pending.id),
                (str(replayed.id), replayed.id),
            ):
                rows.append(
                    Dependency(job_id=letter.id, parent_key=parent_key, parent_id=parent_id)
                )
        for row in rows:
            row.created_at = now
        Dependency.objects.bulk_create(rows)
        WorkflowStep.objects.bulk_create(
            WorkflowStep(job_id=x.id, workflow="bulk", name=x.name, key=x.key, created_at=now)
            for x in letters
        )
    return [letter.id for letter in letters]


@pytest.mark.parametrize("edges", [False, True], ids=["plain", "workflow steps"])
def test_a_replay_runs_a_few_statements_per_batch_whatever_the_batch_holds(monkeypatch, edges):
    monkeypatch.setattr("django_jobs.store.replay.REPLAY_BATCH", 30)

    def statements(count):
        ids = bulk_letters(count, edges=edges)
        with CaptureQueriesContext(connection) as ctx:
            report = control.replay(DeadLetter.objects.filter(id__in=ids), by="ops")
        assert len(report.replayed) == count, str(report)
        return len(ctx.captured_queries)

    one_batch, three_batches = statements(30), statements(90)

    assert one_batch <= (STATEMENTS_PER_BATCH_WITH_EDGES if edges else STATEMENTS_PER_BATCH)
    # The selection's ids (one statement), then the same statements for each batch.
    assert three_batches - 1 == 3 * (one_batch - 1)
    assert Job.objects.filter(name="tests.noop", attempts=0).count() >= 120


def test_a_bulk_replay_of_workflow_steps_is_what_replaying_each_makes():
    [letter_id] = bulk_letters(1, edges=True)
    letter = DeadLetter.objects.get(id=letter_id)
    parents = {e.parent_key: e.parent_id for e in Dependency.objects.filter(job_id=letter_id)}

    report = control.replay(DeadLetter.objects.filter(id=letter_id), by="ops")

    job = Job.objects.get(id=report.replayed[letter_id])
    # Waited for by the blocked job: the new job carries the key its edge names.
    assert job.key == (letter.key or str(letter.id)) and job.dependents == 1
    # The live parent, the pending letter and the replayed letter's live job are unfinished.
    assert (job.waiting_for, job.run_at) == (3, blocked_until())
    copies = {e.parent_key: e for e in Dependency.objects.filter(job_id=job.id)}
    assert copies.keys() == parents.keys()
    unfinished = {key for key, e in copies.items() if e.satisfied_at is None}
    done_key = CompletionMarker.objects.get(job_id__in=parents.values()).key
    assert unfinished == set(parents) - {done_key}
    replayed = DeadLetter.objects.get(id__in=parents.values(), replayed_at__isnull=False)
    assert copies[str(replayed.id)].parent_id == replayed.replay_job_id  # followed to its replay
    for parent_id in (replayed.replay_job_id, *parents.values()):
        row = Job.objects.filter(id=parent_id).first()
        if row is not None:  # the live parents count their new dependent
            assert row.dependents == 1
    assert WorkflowStep.objects.get(workflow="bulk").job_id == job.id


@pytest.mark.skipif(ENGINE == "sqlite", reason="one writer at a time: nothing comes in between")
@pytest.mark.parametrize("taken_by", ["live", "completed"])
def test_a_key_taken_between_the_look_and_the_insert_is_looked_up_again(
    transactional_db, monkeypatch, taken_by
):
    raced = DeadLetterFactory(name="tests.noop", key="raced")
    other = DeadLetterFactory(name="tests.noop", key="not-raced")
    plain = DeadLetterFactory(name="tests.noop")
    engine_class = type(engine(DeadLetter.objects.db))  # its insert_replays, this database's
    original = engine_class.insert_replays
    tries = []

    def rival():
        try:
            if taken_by == "live":
                enqueue("tests.noop", key="raced")
            else:
                MarkerFactory(key="raced")
        finally:
            connections.close_all()

    def insert_after_a_rival(self, queryset, jobs):
        if not tries:  # the first try only: another connection takes the key, and commits
            thread = threading.Thread(target=rival)
            thread.start()
            thread.join(20)
        tries.append(sorted(job.key or "" for job in jobs))
        return original(self, queryset, jobs)

    monkeypatch.setattr(engine_class, "insert_replays", insert_after_a_rival)
    report = control.replay(DeadLetter.objects.filter(id__in=[raced.id, other.id, plain.id]))

    assert tries == [["", "not-raced", "raced"], ["", "not-raced"]]
    assert (report.key_taken if taken_by == "live" else report.completed) == [raced.id]
    assert set(report.replayed) == {other.id, plain.id}
    assert DeadLetter.objects.get(id=raced.id).replayed_at is None
    assert Job.objects.filter(key="raced").count() == (1 if taken_by == "live" else 0)
    assert Job.objects.count() == (3 if taken_by == "live" else 2)


# ---- run now, states ----------------------------------------------------------


def test_run_now_makes_only_scheduled_jobs_due():
    scheduled = JobFactory(run_at=timezone.now() + timedelta(hours=3))
    waiting = JobFactory(run_at=timezone.now() - timedelta(minutes=5))
    running = JobFactory(leased=True, run_at=timezone.now() + timedelta(hours=1))

    moved = JobStore().run_now(Job.objects.all())

    assert moved == 1
    assert Job.objects.get(pk=scheduled.pk).run_at <= timezone.now()
    assert Job.objects.get(pk=waiting.pk).run_at == waiting.run_at
    assert Job.objects.get(pk=running.pk).run_at == running.run_at
    assert set(Job.objects.waiting().values_list("id", flat=True)) == {scheduled.id, waiting.id}


def test_job_states_on_the_database_clock():
    JobFactory(run_at=timezone.now() - timedelta(seconds=1))
    JobFactory(run_at=timezone.now() + timedelta(hours=1))
    JobFactory(leased=True)

    states = sorted(Job.objects.with_state().values_list("state", flat=True))
    assert states == ["running", "scheduled", "waiting"]
