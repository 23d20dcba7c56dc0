"""The worker in-process: outcomes, retries, dead letters, atomic handlers, hygiene, signals."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_jobs import enqueue
from django_jobs.exceptions import LeaseLost
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.rows import ClaimRequest, Finished, Leases
from django_jobs.signals import job_dead_lettered, job_finished, job_started
from django_jobs.store import JobStore
from django_jobs.worker import Worker
from tests.conftest import POSTGRES
from tests.factories import JobFactory, MarkerFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request, settings):
    """Run each test on PostgreSQL's one-statement claim and on the ORM claim."""
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "CLAIM": request.param}
    return request.param


def test_success_deletes_the_job_and_writes_its_marker(run_worker):
    result = enqueue(jobs.record, {"label": "hello"})
    worker = run_worker()
    assert worker.stats.succeeded == 1
    assert Job.objects.count() == 0
    marker = CompletionMarker.objects.get()
    assert marker.job_id == result.id
    assert marker.key == str(result.id)
    assert marker.name == "tests.record"
    assert marker.result == {"label": "hello"}
    assert marker.attempts == 1
    assert list(Audit.objects.values_list("label", "attempt")) == [("hello", 1)]


def test_keyed_job_marker_uses_the_key(run_worker):
    enqueue(jobs.record, {"label": "k"}, key="invoice-7")
    run_worker()
    assert CompletionMarker.objects.get().key == "invoice-7"
    assert enqueue(jobs.record, {"label": "k"}, key="invoice-7").duplicate is True
    assert Job.objects.count() == 0


@pytest.mark.pgbouncer
def test_failure_retries_then_succeeds(run_worker):
    enqueue(jobs.flaky, {"succeed_on": 2})
    worker = run_worker()
    assert (worker.stats.retried, worker.stats.succeeded) == (1, 1)
    marker = CompletionMarker.objects.get()
    assert marker.attempts == 2
    assert marker.result == 2


@pytest.mark.pgbouncer
def test_attempts_exhausted_dead_letter_keeps_every_error(run_worker):
    result = enqueue(jobs.flaky, {})  # never succeeds; max_attempts=3
    run_worker()
    assert Job.objects.count() == 0
    letter = DeadLetter.objects.get()
    assert letter.id == result.id
    assert letter.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert letter.attempts == 3
    assert letter.error == "builtins.RuntimeError: flaky failure on attempt 3"
    assert "Traceback" in letter.traceback and "flaky failure on attempt 3" in letter.traceback
    assert [e["attempt"] for e in letter.errors] == [1, 2, 3]
    assert all(e["type"] == "builtins.RuntimeError" and e["traceback"] for e in letter.errors)
    assert letter.payload == "{}"
    assert letter.enqueued_at is not None and letter.dead_at >= letter.enqueued_at
    assert Audit.objects.count() == 3


def test_retry_waits_for_the_backoff(run_worker):
    with override_settings(
        DJANGO_JOBS={"BACKOFF": {"kind": "fixed", "base": 60, "ceiling": 60, "jitter": 0}}
    ):
        enqueue(jobs.flaky, {"succeed_on": 2})
        run_worker()
    row = Job.objects.get()
    assert row.attempts == 1
    assert row.locked_by is None
    assert row.run_at > timezone.now() + dt.timedelta(seconds=50)
    assert row.errors[0]["message"] == "flaky failure on attempt 1"


@pytest.mark.pgbouncer
def test_fatal_error_dead_letters_at_once(run_worker):
    enqueue(jobs.fatal, {})
    run_worker()
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == (DeadReason.FATAL, 1)
    assert "this cannot succeed" in letter.error


def test_unknown_names_wait_untouched_and_nothing_is_imported(run_worker):
    boom = JobFactory(name="tests.testapp.never_imported.boom")
    JobFactory(name="os.system", payload='"echo pwned > /tmp/pwned"')
    good = enqueue(jobs.record, {"label": "after"})
    run_worker()
    assert "tests.testapp.never_imported" not in sys.modules
    assert CompletionMarker.objects.filter(job_id=good.id).exists()
    # Not claimed (no attempt counted), not dead-lettered: within the grace period they wait.
    assert not DeadLetter.objects.exists()
    assert set(Job.objects.values_list("name", "attempts", "locked_by")) == {
        ("tests.testapp.never_imported.boom", 0, None),
        ("os.system", 0, None),
    }
    assert Job.objects.get(name=boom.name).errors == []


def test_unknown_name_is_dead_lettered_after_the_grace_without_importing_anything(
    run_worker, settings
):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": 0}
    JobFactory(name="tests.testapp.never_imported.boom")
    JobFactory(name="os.system", payload='"echo pwned > /tmp/pwned"')
    good = enqueue(jobs.record, {"label": "after"})
    worker = run_worker()
    assert "tests.testapp.never_imported" not in sys.modules
    reasons = dict(DeadLetter.objects.values_list("name", "reason"))
    assert reasons == {
        "tests.testapp.never_imported.boom": DeadReason.UNKNOWN_NAME,
        "os.system": DeadReason.UNKNOWN_NAME,
    }
    letter = DeadLetter.objects.get(name="os.system")
    assert letter.attempts == 0
    assert "no live worker has known the name 'os.system'" in letter.error
    assert letter.errors[-1]["worker"] == worker.id
    assert CompletionMarker.objects.filter(job_id=good.id).exists()
    assert worker._ops.counters["dead_lettered_unknown"] == 2


def test_a_claimed_job_whose_handler_is_gone_is_released_not_dead_lettered(run_worker):
    row = JobFactory(name="tests.gone")
    worker = Worker(burst=True, concurrency=1)
    worker.names.append("tests.gone")  # as if its handler had been unregistered since
    worker.run()
    assert worker.stats.released == 1
    assert not DeadLetter.objects.exists()
    job = Job.objects.get(id=row.id)
    assert (job.attempts, job.locked_by) == (0, None)


@pytest.mark.parametrize("payload", ["{not json", "", "NaN", '{"a": Infinity}', "[1,"])
def test_undecodable_payload_is_dead_lettered_and_the_worker_goes_on(run_worker, payload):
    JobFactory(name="tests.record", payload=payload)
    good = enqueue(jobs.record, {"label": "next"})
    run_worker()
    letter = DeadLetter.objects.get()
    assert letter.reason == DeadReason.INVALID_PAYLOAD
    assert letter.attempts == 1
    assert letter.payload == payload  # kept as it was, for inspection
    assert CompletionMarker.objects.filter(job_id=good.id).exists()


def test_validator_failure_in_the_worker_is_invalid_payload_without_retries(run_worker):
    JobFactory(name="tests.validated", payload='{"n": -5}', max_attempts=5)
    run_worker()
    letter = DeadLetter.objects.get()
    assert (letter.reason, letter.attempts) == (DeadReason.INVALID_PAYLOAD, 1)
    assert "non-negative integer" in letter.error


def test_timeout_fails_the_attempt_and_discards_the_late_result(run_worker):
    enqueue(jobs.slow, {})  # timeout 0.5 s, max_attempts 2
    started = time.monotonic()
    worker = run_worker()
    assert time.monotonic() - started < 4
    letter = DeadLetter.objects.get()
    assert letter.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert [e["type"] for e in letter.errors] == ["builtins.TimeoutError"] * 2
    assert CompletionMarker.objects.count() == 0  # the late returns were discarded
    assert worker.stats.retried == 1


def test_existing_marker_settles_the_job_without_running_it(run_worker):
    MarkerFactory(key="already")
    JobFactory(name="tests.record", payload='{"label": "again"}', key="already")
    worker = run_worker()
    assert Audit.objects.count() == 0
    assert Job.objects.count() == 0
    assert worker.stats.skipped == 1


def test_bad_return_value_fails_the_attempt(run_worker):
    enqueue(jobs.bad_return, max_attempts=1)
    run_worker()
    letter = DeadLetter.objects.get()
    assert letter.error.startswith(
        "django_jobs.exceptions.UnstorableResult: the handler returned a value that is not JSON"
    )


def test_async_handler(run_worker):
    enqueue(jobs.async_record, {"label": "from a coroutine"})
    run_worker()
    assert CompletionMarker.objects.get().result == "async-ok"
    assert Audit.objects.get().label == "from a coroutine"


def test_priority_then_run_at_order(run_worker):
    enqueue(jobs.record, {"label": "low"}, priority=-5)
    enqueue(jobs.record, {"label": "normal-1"})
    enqueue(jobs.record, {"label": "high"}, priority=50)
    enqueue(jobs.record, {"label": "normal-2"})
    run_worker(concurrency=1, batch=1)
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == [
        "high",
        "normal-1",
        "normal-2",
        "low",
    ]


def test_scheduled_jobs_wait(run_worker):
    enqueue(jobs.record, {"label": "later"}, delay=60)
    worker = run_worker()
    assert worker.stats.claimed == 0
    assert Job.objects.count() == 1


def test_worker_serves_only_its_queues(run_worker):
    enqueue(jobs.other_queue)
    enqueue(jobs.record, {"label": "default"})
    run_worker(queues=["emails"])
    assert list(Audit.objects.values_list("label", flat=True)) == ["emails"]
    assert Job.objects.get().queue == "default"


def test_default_queues_are_every_handlers_queue(run_worker):
    enqueue(jobs.other_queue)
    enqueue(jobs.record, {"label": "default"})
    run_worker()
    assert Job.objects.count() == 0


def test_per_handler_concurrency_cap(run_worker):
    jobs.running_now.update(count=0, max=0)
    for _ in range(6):
        enqueue(jobs.capped)
    run_worker(concurrency=4)
    assert jobs.running_now["max"] == 1
    assert CompletionMarker.objects.count() == 6


def test_max_jobs_stops_after_that_many_and_leaves_no_lease(run_worker):
    for i in range(10):
        enqueue(jobs.record, {"label": str(i)})
    worker = run_worker(burst=False, max_jobs=3, concurrency=1)
    assert worker.stats.succeeded == 3
    assert Job.objects.count() == 7
    assert not Job.objects.filter(locked_by__isnull=False).exists()


class TestAtomicHandlers:
    def test_effects_and_marker_commit_together(self, run_worker):
        enqueue(jobs.record_atomic, {"label": "once"})
        run_worker()
        assert Audit.objects.count() == 1
        assert CompletionMarker.objects.count() == 1
        assert Job.objects.count() == 0

    def test_a_stale_holder_rolls_back(self):
        enqueue(jobs.record_atomic, {"label": "x"})
        [stale] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w1#1", lease=30)
        )
        Job.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        [fresh] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w2#1", lease=30)
        )
        assert fresh.attempts == 2
        assert fresh.errors[-1]["type"] == "django_jobs.LeaseExpired"
        with pytest.raises(LeaseLost), transaction.atomic():
            Audit.objects.create(label="stale effect")
            JobStore().complete_atomically(stale, None)
        assert Audit.objects.count() == 0  # rolled back
        with transaction.atomic():
            Audit.objects.create(label="fresh effect")
            assert JobStore().complete_atomically(fresh, None) is True
        assert list(Audit.objects.values_list("label", flat=True)) == ["fresh effect"]
        assert CompletionMarker.objects.count() == 1

    def test_a_second_run_after_the_marker_rolls_back(self):
        enqueue(jobs.record_atomic, {"label": "x"}, key="pay-1")
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="w1#1", lease=30))
        MarkerFactory(key="pay-1")  # someone finished this key meanwhile
        with transaction.atomic():
            Audit.objects.create(label="second effect")
            assert JobStore().complete_atomically(job, None) is False
            transaction.set_rollback(True)
        assert Audit.objects.count() == 0

    def test_worker_skips_marker_conflicts(self, run_worker):
        enqueue(jobs.record_atomic, {"label": "x"}, key="pay-2")
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="w1#1", lease=30))
        Job.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        with transaction.atomic():  # the first holder finishes late but first
            Audit.objects.create(label="first")
            assert JobStore().complete_atomically(job, None) is True
        worker = run_worker()
        assert worker.stats.claimed == 0  # nothing left to run
        assert Audit.objects.count() == 1


class TestLeases:
    def test_expired_lease_is_taken_over_with_the_lost_attempt_noted(self, run_worker):
        enqueue(jobs.record, {"label": "x"})
        JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="dead-worker:1:aa#1", lease=30)
        )
        worker = run_worker()
        assert worker.stats.claimed == 0  # lease still valid: nobody may take it
        Job.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        run_worker()
        marker = CompletionMarker.objects.get()
        assert marker.attempts == 2

    def test_poison_job_that_always_loses_its_worker_dies_after_max_attempts(self, run_worker):
        result = enqueue(jobs.record, {"label": "x"}, max_attempts=2)
        for n in (1, 2):
            [job] = JobStore().claim(
                ClaimRequest(queues=["default"], limit=1, token=f"w{n}#1", lease=30)
            )
            assert job.attempts == n
            Job.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        run_worker()
        letter = DeadLetter.objects.get(id=result.id)
        assert letter.reason == DeadReason.ATTEMPTS_EXHAUSTED
        assert letter.attempts == 2
        assert Audit.objects.count() == 0  # never ran a third time
        assert [e["attempt"] for e in letter.errors] == [1, 2]

    def test_heartbeat_extends_running_leases(self):
        enqueue(jobs.sleep, {"seconds": 1.5})
        worker = Worker(burst=True, lease=1.0, heartbeat=0.2, concurrency=1)
        worker.run()
        assert worker.stats.succeeded == 1
        assert worker.stats.lost == 0
        assert Audit.objects.filter(label__startswith="start").count() == 1

    def test_without_heartbeats_a_long_job_loses_its_lease(self):
        enqueue(jobs.sleep, {"seconds": 2.5})
        holder = Worker(burst=True, lease=0.5, heartbeat=0, concurrency=1)

        def steal_once_expired():
            # Wait for the holder's lease to run out by the database's clock, not a fixed
            # sleep: on a loaded machine the holder may claim late, and a burst thief that
            # came too early would find nothing and leave.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if Job.objects.filter(lease_expires_at__lt=timezone.now()).exists():
                    Worker(burst=True, concurrency=1).run()
                    break
                time.sleep(0.02)
            connection.close()

        thief = threading.Thread(target=steal_once_expired)
        thief.start()
        holder.run()
        thief.join()
        assert holder.stats.lost == 1  # its late settle changed nothing
        assert CompletionMarker.objects.count() == 1
        assert Audit.objects.filter(label__startswith="start").count() == 2

    def test_extend_lease_from_the_handler(self):
        enqueue(jobs.record, {"label": "x"})
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="w#1", lease=5))
        assert JobStore().extend_leases([job], 3600) == Leases({job.id: False}, frozenset())
        row = Job.objects.get()
        assert row.lease_expires_at > timezone.now() + dt.timedelta(minutes=59)
        JobStore().extend_leases([job], 5)  # a heartbeat never shortens it
        assert Job.objects.get().lease_expires_at == row.lease_expires_at

    def test_release_gives_the_attempt_back(self):
        enqueue(jobs.record, {"label": "x"})
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="w#1", lease=30))
        assert Job.objects.get().attempts == 1
        assert JobStore().release([job]) == 1
        row = Job.objects.get()
        assert (row.attempts, row.locked_by, row.lease_expires_at) == (0, None, None)

    def test_settles_are_fenced_on_the_token(self):
        enqueue(jobs.record, {"label": "x"})
        [job] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token="w#1", lease=30))
        job.token = "someone-else#9"
        assert JobStore().complete([Finished(job.id, job.token, None, 0)]) == set()
        assert JobStore().retry(job, delay=0, error={}) is False
        assert JobStore().dead_letter(job, reason=DeadReason.FATAL, error={}) is None
        assert JobStore().release([job]) == 0
        assert Job.objects.count() == 1 and CompletionMarker.objects.count() == 0
        assert DeadLetter.objects.count() == 0


class TestConnectionHygiene:
    def test_open_transaction_left_by_a_handler_is_rolled_back(self, run_worker):
        enqueue(jobs.leaky)
        enqueue(jobs.record, {"label": "after"})
        run_worker(concurrency=1)
        assert list(Audit.objects.values_list("label", flat=True)) == ["after"]
        assert CompletionMarker.objects.count() == 2

    @pytest.mark.postgres
    def test_connection_is_kept_across_jobs_with_conn_max_age_zero(self, run_worker):
        assert connection.settings_dict["CONN_MAX_AGE"] == 0
        with override_settings(DEBUG=True):
            for _ in range(20):
                enqueue(jobs.connection_info)
            run_worker(concurrency=1)
        labels = list(Audit.objects.values_list("label", flat=True))
        pids = {label.split()[0] for label in labels}
        assert len(pids) == 1, labels  # one connection for all 20 jobs
        # With DEBUG the query log is cleared between jobs instead of growing.
        assert max(int(label.split("queries=")[1]) for label in labels) <= 3


class TestSignalsAndLogs:
    def test_signals_carry_the_outcome(self, run_worker):
        seen = []

        def on_started(sender, **kw):
            seen.append(("started", sender, kw["attempt"]))

        def on_finished(sender, **kw):
            seen.append(("finished", sender, kw["outcome"]))

        def on_dead(sender, **kw):
            seen.append(("dead", sender, kw["reason"]))

        job_started.connect(on_started)
        job_finished.connect(on_finished)
        job_dead_lettered.connect(on_dead)
        try:
            enqueue(jobs.record, {"label": "ok"})
            enqueue(jobs.fatal)
            run_worker(concurrency=1)
        finally:
            job_started.disconnect(on_started)
            job_finished.disconnect(on_finished)
            job_dead_lettered.disconnect(on_dead)
        assert ("started", "tests.record", 1) in seen
        assert ("finished", "tests.record", "succeeded") in seen
        assert ("started", "tests.fatal", 1) in seen
        assert ("dead", "tests.fatal", DeadReason.FATAL) in seen
        assert ("finished", "tests.fatal", "dead") in seen

    def test_job_log_records_carry_job_fields(self, run_worker, caplog):
        enqueue(jobs.flaky, {"succeed_on": 2})
        with caplog.at_level(logging.DEBUG, logger="django_jobs"):
            run_worker()
        job_records = [r for r in caplog.records if hasattr(r, "job_id")]
        assert job_records
        for record in job_records:
            assert record.job_name == "tests.flaky"
            assert record.queue == "default"
            assert record.attempt >= 1


def test_stop_from_another_thread_releases_claimed_jobs():
    for i in range(5):
        enqueue(jobs.sleep, {"seconds": 0.3, "label": str(i)})
    worker = Worker(concurrency=1, grace=5)
    started = threading.Event()

    def on_start(**kwargs):
        started.set()

    def stop_once_started():
        started.wait(30)  # a loaded machine may take long to claim; a timer would race
        worker.stop()

    job_started.connect(on_start, weak=False)
    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    try:
        worker.run()
    finally:
        job_started.disconnect(on_start)
        stopper.join()
    assert started.is_set()
    # The running job finished; nothing else was started, and no attempt was consumed.
    assert CompletionMarker.objects.count() == 1
    assert Job.objects.count() == 4
    assert set(Job.objects.values_list("attempts", flat=True)) == {0}
    assert not Job.objects.filter(locked_by__isnull=False).exists()


@pytest.mark.parametrize(
    ("vendor", "args", "refused"),
    [
        ("mysql", (1644, "poisoned result"), True),  # a trigger's SIGNAL SQLSTATE '45000'
        ("mysql", (1153, "Got a packet bigger than 'max_allowed_packet' bytes"), True),
        ("mysql", (2006, "Server has gone away"), False),
        ("mysql", (2013, "Lost connection to server during query"), False),
        ("mysql", (1213, "Deadlock found when trying to get lock"), False),  # retried
        ("postgresql", (1644, "not a MySQL error number here"), False),
        ("mysql", (), False),
    ],
)
def test_only_a_signal_or_an_oversized_packet_is_a_refused_statement(vendor, args, refused):
    from django_jobs.store.mysql import MySQL
    from django_jobs.store.postgres import Postgres

    engine = MySQL() if vendor == "mysql" else Postgres()
    assert engine.refused(OperationalError(*args)) is refused
    # After an oversized packet the server has closed the connection: DbGuard reconnects.
    dropped = vendor == "mysql" and args[:1] == (1153,)
    assert engine.dropped_connection(OperationalError(*args)) is dropped
