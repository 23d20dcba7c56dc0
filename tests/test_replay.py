"""Operators' state changes: replay dead letters, make scheduled jobs due (cancel: test_cancel)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_jobs import enqueue
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, JobQuerySet
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
    report = DeadLetter.objects.filter(pk=letter.pk).replay(by="ada")

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
    first = DeadLetter.objects.filter(pk=letter.pk).replay(by="ada")
    second = DeadLetter.objects.filter(pk=letter.pk).replay(by="bob")

    assert len(first.replayed) == 1
    assert str(second) == "0 replayed, 1 already replayed"
    assert Job.objects.count() == 1
    letter.refresh_from_db()
    assert letter.replayed_by == "ada"


@pytest.mark.pgbouncer
@pytest.mark.django_db(transaction=True)
def test_the_replayed_job_runs_and_leaves_its_marker(run_worker):
    letter = DeadLetterFactory(name="tests.record", payload='{"label": "second life"}')
    job_id = DeadLetter.objects.filter(pk=letter.pk).replay().replayed[letter.id]

    run_worker()

    assert Audit.objects.get().label == "second life"
    marker = CompletionMarker.objects.get(job_id=job_id)
    assert marker.attempts == 1
    assert not Job.objects.exists()


def test_a_letter_whose_key_a_live_job_holds_is_not_replayed():
    enqueue("tests.record", {"label": "new"}, key="shared")
    letter = DeadLetterFactory(key="shared", payload='{"label": "old"}')

    report = DeadLetter.objects.filter(pk=letter.pk).replay()

    assert report.key_taken == [letter.id]
    assert "whose key a live job holds" in str(report)
    assert Job.objects.count() == 1
    letter.refresh_from_db()
    assert letter.replayed_at is None and letter.replay_job_id is None


def test_a_letter_whose_key_completed_since_is_not_replayed():
    letter = DeadLetterFactory(key="done-key")
    MarkerFactory(key="done-key")

    report = DeadLetter.objects.filter(pk=letter.pk).replay()

    assert report.completed == [letter.id]
    assert not Job.objects.exists()
    letter.refresh_from_db()
    assert letter.replayed_at is None


def test_a_letter_with_no_registered_handler_is_not_replayed():
    letter = DeadLetterFactory(name="os.system", reason=DeadReason.UNKNOWN_NAME)

    report = DeadLetter.objects.filter(pk=letter.pk).replay()

    assert report.unknown == [letter.id]
    assert not Job.objects.exists()


def test_replay_later_schedules_the_job():
    letters = DeadLetterFactory.create_batch(2)
    at = timezone.now() + timedelta(hours=2)
    DeadLetter.objects.filter(pk=letters[0].pk).replay(run_at=at)
    DeadLetter.objects.filter(pk=letters[1].pk).replay(delay=600)

    later = Job.objects.get(id=DeadLetter.objects.get(pk=letters[0].pk).replay_job_id)
    assert later.run_at == at
    delayed = Job.objects.get(id=DeadLetter.objects.get(pk=letters[1].pk).replay_job_id)
    assert timedelta(seconds=590) < delayed.run_at - timezone.now() <= timedelta(seconds=600)
    assert Job.objects.scheduled().count() == 2
    with pytest.raises(ValueError, match="run_at or delay"):
        DeadLetter.objects.all().replay(run_at=at, delay=1)
    with pytest.raises(ValueError, match="delay must be a number of seconds from 0"):
        DeadLetter.objects.all().replay(delay=-1)


def test_bulk_replay_reports_each_outcome_and_progress(settings):
    fresh = DeadLetterFactory.create_batch(5)
    replayed = DeadLetterFactory(replayed_at=timezone.now(), replay_job_id=fresh[0].id)
    seen = []

    report = DeadLetter.objects.all().replay(
        by="ops", progress=lambda done, total: seen.append((done, total))
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
    original_insert = JobQuerySet.insert_replays

    def slow_insert(self, *args, **kwargs):
        if threading.current_thread().name == "tab-1":
            inside.set()
            release.wait(10)  # hold the letter's row lock inside the first replay's transaction
        return original_insert(self, *args, **kwargs)

    monkeypatch.setattr(JobQuerySet, "insert_replays", slow_insert)

    def tab(name):
        try:
            reports[name] = DeadLetter.objects.filter(pk=letter.pk).replay(by=name)
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
            reports.append(DeadLetter.objects.all().replay(by=threading.current_thread().name))
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
        DeadLetter.objects.filter(pk=letter.pk).replay()
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


# ---- run now, states ----------------------------------------------------------


def test_run_now_makes_only_scheduled_jobs_due():
    scheduled = JobFactory(run_at=timezone.now() + timedelta(hours=3))
    waiting = JobFactory(run_at=timezone.now() - timedelta(minutes=5))
    running = JobFactory(leased=True, run_at=timezone.now() + timedelta(hours=1))

    moved = Job.objects.all().run_now()

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
