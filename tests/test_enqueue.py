"""enqueue / enqueue_on_commit: what is written, dedupe, bad input, transactions."""

from __future__ import annotations

import datetime as dt
import json
import threading
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import (
    IdempotencyConflict,
    InvalidJob,
    InvalidPayload,
    UnknownJob,
    enqueue,
    enqueue_on_commit,
    job,
)
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import unregister
from django_jobs.rows import ClaimRequest, Finished
from django_jobs.signals import job_enqueued
from django_jobs.store import JobStore, pgrun
from tests.conftest import POSTGRES
from tests.factories import MarkerFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db


def test_enqueue_writes_one_row_with_the_handlers_defaults():
    result = enqueue(jobs.flaky, {"b": 1, "a": [1, 2.5, None, True, "é"]})
    assert result.duplicate is False
    row = Job.objects.get()
    assert row.id == result.id
    assert row.name == "tests.flaky"
    assert row.queue == "default"
    assert row.priority == 0
    assert row.max_attempts == 3  # from @job(max_attempts=3)
    assert row.attempts == 0
    assert row.locked_by is None and row.lease_expires_at is None
    # Stored as text exactly as given: key order and values survive.
    assert row.payload == '{"b":1,"a":[1,2.5,null,true,"é"]}'
    assert json.loads(row.payload) == {"b": 1, "a": [1, 2.5, None, True, "é"]}


def test_enqueue_by_name_and_options_override_defaults():
    run_at = timezone.now() + dt.timedelta(hours=1)
    result = enqueue("tests.noop", [1], priority=7, queue="bulk", run_at=run_at, max_attempts=9)
    row = Job.objects.get(id=result.id)
    assert (row.priority, row.queue, row.max_attempts) == (7, "bulk", 9)
    assert row.run_at == run_at


def test_handler_queue_is_the_default_queue_of_its_jobs():
    result = enqueue(jobs.other_queue)
    assert result.queue == "emails"
    assert Job.objects.get().queue == "emails"


def test_handler_shortcut_methods():
    first = jobs.noop.enqueue({"x": 1})
    second = jobs.noop.enqueue_on_commit({"x": 2})
    assert Job.objects.filter(id__in=[first.id, second.id]).count() == 2


@pytest.mark.parametrize("delay", [dt.timedelta(minutes=5), 300, 300.0])
def test_delay_schedules_on_the_database_clock(delay):
    before = timezone.now()
    enqueue(jobs.noop, delay=delay)
    row = Job.objects.get()
    assert (
        before + dt.timedelta(seconds=299)
        <= row.run_at
        <= timezone.now() + dt.timedelta(seconds=301)
    )


def test_no_delay_is_due_now():
    enqueue(jobs.noop)
    row = Job.objects.get()
    assert abs((row.run_at - timezone.now()).total_seconds()) < 5
    assert row.run_at == row.enqueued_at


class TestDedupe:
    def test_same_key_with_a_live_job_is_a_duplicate(self):
        first = enqueue(jobs.record, {"label": "x"}, key="order-1")
        second = enqueue(jobs.record, {"label": "x"}, key="order-1")
        assert second.duplicate is True
        assert second.id == first.id
        assert Job.objects.count() == 1

    def test_key_order_of_the_payload_does_not_matter(self):
        first = enqueue(jobs.record, {"label": "x", "n": 1}, key="k")
        second = enqueue(jobs.record, {"n": 1, "label": "x"}, key="k")
        assert (second.duplicate, second.id) == (True, first.id)

    def test_same_key_after_completion_is_a_duplicate(self):
        marker = MarkerFactory(key="done-key", name="tests.record", fingerprint=None)
        result = enqueue(jobs.record, {"label": "x"}, key="done-key")
        assert result.duplicate is True
        assert result.id == marker.job_id
        assert Job.objects.count() == 0

    def test_same_key_different_payload_conflicts_and_writes_nothing(self):
        enqueue(jobs.record, {"label": "x"}, key="k")
        with pytest.raises(IdempotencyConflict, match="'k'"):
            enqueue(jobs.record, {"label": "y"}, key="k")
        with pytest.raises(IdempotencyConflict):
            enqueue(jobs.noop, {"label": "x"}, key="k")  # another name
        assert Job.objects.count() == 1

    def test_completed_key_with_different_payload_conflicts(self):
        from django_jobs import payloads

        MarkerFactory(key="k", fingerprint=payloads.fingerprint("tests.record", '{"label":"x"}'))
        with pytest.raises(IdempotencyConflict):
            enqueue(jobs.record, {"label": "other"}, key="k")
        assert enqueue(jobs.record, {"label": "x"}, key="k").duplicate is True

    def test_a_dead_letter_does_not_hold_its_key(self):
        from tests.factories import DeadLetterFactory

        DeadLetterFactory(key="k")
        assert enqueue(jobs.record, {"label": "x"}, key="k").duplicate is False


def _tables():
    return (Job.objects.count(), CompletionMarker.objects.count(), DeadLetter.objects.count())


class _Thing:
    pass


BAD_PAYLOADS = {
    "set": {1, 2},
    "datetime": {"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
    "decimal": Decimal("1.5"),
    "object": {"x": _Thing()},
    "nan": {"x": float("nan")},
    "infinity": [float("inf")],
    "negative infinity": -float("inf"),
    "int key": {1: "a"},
    "nested int key": {"a": [{2: "b"}]},
    "bytes": b"raw",
    "lone surrogate": "\ud800",
    "too large": {"blob": "x" * (64 * 1024)},
}


@pytest.mark.parametrize("payload", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_bad_payloads_raise_and_write_nothing(payload):
    with pytest.raises(InvalidPayload):
        enqueue(jobs.noop, payload)
    with pytest.raises(InvalidPayload):
        enqueue_on_commit(jobs.noop, payload, key="k")
    assert _tables() == (0, 0, 0)


def test_circular_payload_is_refused():
    loop = []
    loop.append(loop)
    with pytest.raises(InvalidPayload, match="circular"):
        enqueue(jobs.noop, loop)


def test_payload_size_cap_is_configurable():
    with override_settings(DJANGO_JOBS={"MAX_PAYLOAD_BYTES": 10}):
        with pytest.raises(InvalidPayload, match="10-byte limit"):
            enqueue(jobs.noop, {"text": "more than ten bytes"})
        enqueue(jobs.noop, [1])
    enqueue(jobs.noop, {"text": "more than ten bytes"})
    assert Job.objects.count() == 2


def test_json_encoder_setting_allows_declared_types():
    with override_settings(
        DJANGO_JOBS={"JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder"}
    ):
        enqueue(
            jobs.noop, {"when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "amount": Decimal("1.50")}
        )
    assert json.loads(Job.objects.get().payload) == {
        "when": "2026-01-01T00:00:00Z",
        "amount": "1.50",
    }


def _plain_function(payload, ctx):
    pass


BAD_OPTIONS = {
    "unknown name": (("tests.does_not_exist",), {}),
    "empty name": (("",), {}),
    "name with space": (("tests.no op",), {}),
    "name with control char": (("tests.noop\x00",), {}),
    "over-long name": (("a" * 201,), {}),
    "name not a string": ((42,), {}),
    "undecorated function": ((_plain_function,), {}),
    "empty queue": ((jobs.noop,), {"queue": ""}),
    "queue with newline": ((jobs.noop,), {"queue": "q\n"}),
    "over-long queue": ((jobs.noop,), {"queue": "q" * 101}),
    "empty key": ((jobs.noop,), {"key": ""}),
    "over-long key": ((jobs.noop,), {"key": "k" * 256}),
    "key with control char": ((jobs.noop,), {"key": "a\x07b"}),
    "key with newline": ((jobs.noop,), {"key": "a\nb"}),
    "key not a string": ((jobs.noop,), {"key": 12}),
    "negative delay": ((jobs.noop,), {"delay": -1}),
    "negative timedelta": ((jobs.noop,), {"delay": dt.timedelta(seconds=-1)}),
    "nan delay": ((jobs.noop,), {"delay": float("nan")}),
    "bool delay": ((jobs.noop,), {"delay": True}),
    "string delay": ((jobs.noop,), {"delay": "5"}),
    "delay and run_at": ((jobs.noop,), {"delay": 5, "run_at": timezone.now()}),
    "naive run_at": ((jobs.noop,), {"run_at": dt.datetime(2030, 1, 1)}),
    "run_at not a datetime": ((jobs.noop,), {"run_at": "2030-01-01"}),
    "float priority": ((jobs.noop,), {"priority": 1.5}),
    "string priority": ((jobs.noop,), {"priority": "1"}),
    "bool priority": ((jobs.noop,), {"priority": True}),
    "priority too high": ((jobs.noop,), {"priority": 101}),
    "priority too low": ((jobs.noop,), {"priority": -101}),
    "zero max_attempts": ((jobs.noop,), {"max_attempts": 0}),
}


@pytest.mark.parametrize(("args", "kwargs"), BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_options_raise_and_write_nothing(args, kwargs):
    with pytest.raises(InvalidJob):
        enqueue(*args, {"x": 1}, **kwargs)
    with pytest.raises(InvalidJob):
        enqueue_on_commit(*args, {"x": 1}, **kwargs)
    assert _tables() == (0, 0, 0)


def test_unknown_name_says_so():
    with pytest.raises(UnknownJob, match="tests.nope"):
        enqueue("tests.nope")


def test_unknown_queue_when_queues_are_listed():
    with override_settings(DJANGO_JOBS={"QUEUES": ["default"]}):
        with pytest.raises(InvalidJob, match="unknown queue 'emails'"):
            enqueue(jobs.other_queue)
        enqueue(jobs.noop)
    assert Job.objects.count() == 1


def test_validator_runs_at_enqueue():
    with pytest.raises(InvalidPayload, match="non-negative integer"):
        enqueue(jobs.validated, {"n": -1})
    enqueue(jobs.validated, {"n": 1})
    assert Job.objects.count() == 1


def test_duplicate_handler_names_are_an_error():
    from django_jobs.exceptions import HandlerConflict

    @job(name="tests.dup")
    def first(payload, ctx):
        pass

    try:
        with pytest.raises(HandlerConflict, match="tests.dup"):

            @job(name="tests.dup")
            def second(payload, ctx):
                pass
    finally:
        unregister("tests.dup")


@pytest.mark.django_db(transaction=True)
class TestTransactions:
    def test_rolled_back_transaction_leaves_no_job(self):
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue_on_commit(jobs.noop, {"x": 1})
            assert Job.objects.count() == 1  # visible inside the transaction
            raise RuntimeError("roll back")
        assert Job.objects.count() == 0

    def test_a_connection_closed_inside_an_atomic_block_does_not_break_the_next_enqueue(self):
        # manage.py's command-line path (run_from_argv) closes every connection when a
        # command ends, even inside a transaction; so may close_old_connections(). Django
        # reconnects at the next query and forgets the broken block: the package's own
        # statements (sql.run on PostgreSQL) must too, not fail on its stale state.
        with transaction.atomic():
            connection.close()
        result = enqueue(jobs.noop)
        [claimed] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w#1", lease=30)
        )
        assert claimed.id == result.id
        if POSTGRES:
            with transaction.atomic():
                connection.close()
            assert pgrun.run_locked("default", "k", "SELECT 1", None) == ([], [(1,)])
        # A block that is still broken is still refused.
        with transaction.atomic():
            transaction.set_rollback(True)
            with pytest.raises(TransactionManagementError):
                enqueue(jobs.noop)

    def test_job_is_invisible_to_other_connections_until_commit(self):
        other = connections.create_connection("default")
        try:
            with transaction.atomic():
                result = enqueue_on_commit(jobs.noop, {"x": 1})
                with other.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM django_jobs_job")
                    assert cursor.fetchone()[0] == 0
            with other.cursor() as cursor:
                cursor.execute("SELECT id FROM django_jobs_job")
                assert [str(r[0]).replace("-", "") for r in cursor.fetchall()] == [result.id.hex]
        finally:
            other.close()

    def test_outside_a_transaction_it_writes_at_once(self):
        enqueue_on_commit(jobs.noop)
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM django_jobs_job")
                assert cursor.fetchone()[0] == 1
        finally:
            other.close()

    def test_failed_enqueue_does_not_break_the_callers_transaction(self):
        with transaction.atomic():
            enqueue(jobs.record, {"label": "a"}, key="k")
            with pytest.raises(IdempotencyConflict):
                enqueue(jobs.record, {"label": "b"}, key="k")
            with pytest.raises(InvalidPayload):
                enqueue(jobs.noop, {1, 2})
            enqueue(jobs.noop)
        assert Job.objects.count() == 2

    def test_job_enqueued_signal_fires_on_commit_only(self):
        seen = []

        def receiver(sender, **kwargs):
            seen.append((sender, kwargs["job_id"], kwargs["duplicate"]))

        job_enqueued.connect(receiver)
        try:
            with pytest.raises(RuntimeError), transaction.atomic():
                enqueue_on_commit(jobs.noop)
                raise RuntimeError
            assert seen == []
            with transaction.atomic():
                result = enqueue_on_commit(jobs.noop)
                assert seen == []
            assert seen == [("tests.noop", result.id, False)]
        finally:
            job_enqueued.disconnect(receiver)

    @pytest.mark.postgres
    def test_concurrent_enqueues_of_one_key_make_one_row(self):
        entered = threading.Event()
        release = threading.Event()
        results = {}

        def first():
            with transaction.atomic():
                results["first"] = enqueue(jobs.record, {"label": "x"}, key="same")
                entered.set()
                release.wait(10)
            connection.close()

        def second():
            entered.wait(10)
            results["second"] = enqueue(jobs.record, {"label": "x"}, key="same")
            connection.close()

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        entered.wait(10)
        threads[1].join(0.5)
        assert threads[1].is_alive(), "the second enqueue must wait for the first transaction"
        release.set()
        for t in threads:
            t.join(10)
        assert results["second"].duplicate is True
        assert results["second"].id == results["first"].id
        assert Job.objects.count() == 1

    def test_a_key_that_completes_while_the_enqueue_waits_is_a_duplicate(self):
        # The worker's settle deletes the live job and writes its marker in one
        # transaction; an enqueue of the key waits for it, then must see the marker.
        live = enqueue(jobs.record, {"label": "x"}, key="settling")
        [claimed] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w#1", lease=30)
        )
        settled = threading.Event()
        release = threading.Event()
        results = {}

        def worker():
            with transaction.atomic():
                JobStore().complete([Finished(claimed.id, claimed.token, None, 0)])
                settled.set()
                release.wait(10)
            connection.close()

        def enqueuer():
            settled.wait(10)
            results["again"] = enqueue(jobs.record, {"label": "x"}, key="settling")
            connection.close()

        threads = [threading.Thread(target=worker), threading.Thread(target=enqueuer)]
        for t in threads:
            t.start()
        settled.wait(10)
        threads[1].join(0.5)
        assert threads[1].is_alive(), "the enqueue must wait for the settle"
        release.set()
        for t in threads:
            t.join(10)
        assert results["again"].duplicate is True
        assert results["again"].id == live.id
        assert Job.objects.count() == 0
        assert CompletionMarker.objects.get().key == "settling"

    @pytest.mark.postgres
    def test_many_threads_racing_on_one_key(self):
        barrier = threading.Barrier(8)
        ids = []

        def go():
            barrier.wait()
            ids.append(enqueue(jobs.record, {"label": "x"}, key="race"))
            connection.close()

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len({r.id for r in ids}) == 1
        assert sum(not r.duplicate for r in ids) == 1
        assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
class TestCommitOfAnotherDatabase:
    def test_job_follows_the_commit_of_the_named_alias(self):
        with transaction.atomic(using="other"):
            result = enqueue_on_commit(jobs.noop, {"x": 1}, commit_of="other")
            assert result.duplicate is None
            assert Job.objects.count() == 0  # not yet: written after "other" commits
        assert Job.objects.get().id == result.id

    def test_rollback_of_the_named_alias_drops_the_job(self):
        with pytest.raises(RuntimeError), transaction.atomic(using="other"):
            enqueue_on_commit(jobs.noop, {"x": 1}, commit_of="other")
            raise RuntimeError
        assert Job.objects.count() == 0

    def test_unknown_alias_is_refused(self):
        with pytest.raises(InvalidJob, match="nope"):
            enqueue_on_commit(jobs.noop, commit_of="nope")

    def test_a_transaction_open_only_on_another_alias_is_refused_without_commit_of(self):
        # Written at once on the jobs database, the job would outlive this rollback.
        with pytest.raises(RuntimeError), transaction.atomic(using="other"):
            with pytest.raises(InvalidJob, match="commit_of='other'"):
                enqueue_on_commit(jobs.noop, {"x": 1})
            raise RuntimeError
        assert Job.objects.count() == 0

    def test_a_transaction_open_on_the_jobs_database_too_holds_the_job(self):
        with pytest.raises(RuntimeError), transaction.atomic(using="other"):
            with transaction.atomic():
                enqueue_on_commit(jobs.noop, {"x": 1})
                raise RuntimeError
        assert Job.objects.count() == 0
        with transaction.atomic(using="other"), transaction.atomic():
            enqueue_on_commit(jobs.noop, {"x": 1})
        assert Job.objects.count() == 1

    def test_enqueue_still_writes_at_once_whatever_is_open_elsewhere(self):
        with transaction.atomic(using="other"):
            enqueue(jobs.noop, {"x": 1})
            assert Job.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_enqueue_notifies_listeners_at_commit_with_the_queue_only():
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as listener:
        listener.execute("LISTEN django_jobs")
        with transaction.atomic():
            enqueue_on_commit(jobs.other_queue, {"secret": "not in the notification"})
            assert list(listener.notifies(timeout=0.2)) == []
        notes = list(listener.notifies(timeout=2, stop_after=1))
        assert [n.payload for n in notes] == ["emails"]
        enqueue(jobs.noop, delay=60)  # not due: no wake-up needed
        assert list(listener.notifies(timeout=0.3)) == []


class TestEnqueueMany:
    def test_writes_every_job_in_order_with_the_same_semantics(self):
        from django_jobs import enqueue_many

        payloads = [{"i": i, "text": "tab\there \\ back"} for i in range(50)]
        results = enqueue_many(jobs.record, payloads, priority=3)
        assert [r.duplicate for r in results] == [False] * 50
        rows = {row.id: row for row in Job.objects.all()}
        assert len(rows) == 50
        for result, payload in zip(results, payloads, strict=True):
            row = rows[result.id]
            assert json.loads(row.payload) == payload
            assert (row.priority, row.queue, row.attempts, row.errors) == (3, "default", 0, [])

    def test_jobs_without_keys_go_in_batches(self):
        from django_jobs import enqueue_many
        from django_jobs.store.base import BULK_BATCH

        with CaptureQueriesContext(connection) as queries:
            results = enqueue_many(jobs.noop, list(range(2 * BULK_BATCH + 1)))
        inserts = [q for q in queries if q["sql"].lstrip().upper().startswith("INSERT")]
        # PostgreSQL: one COPY; elsewhere: bulk_create, a statement per batch.
        assert len(inserts) == (0 if POSTGRES else 3)
        assert Job.objects.count() == len(results) == 2 * BULK_BATCH + 1

    def test_keys_dedupe_within_the_call_and_against_the_table(self):
        from django_jobs import enqueue_many

        first = enqueue(jobs.record, {"label": "a"}, key="a")
        results = enqueue_many(
            jobs.record,
            [{"label": "a"}, {"label": "b"}, {"label": "b"}, {"label": "c"}],
            keys=["a", "b", "b", None],
        )
        assert [r.duplicate for r in results] == [True, False, True, False]
        assert results[0].id == first.id
        assert results[2].id == results[1].id
        assert Job.objects.count() == 3

    def test_one_bad_item_writes_nothing(self):
        from django_jobs import enqueue_many

        with pytest.raises(InvalidPayload, match="job 2"):
            enqueue_many(jobs.noop, [{"ok": 1}, {"ok": 2}, {"bad": {1, 2}}])
        enqueue(jobs.record, {"label": "x"}, key="taken")
        with pytest.raises(IdempotencyConflict):
            enqueue_many(jobs.record, [{"label": "new"}, {"label": "other"}], keys=[None, "taken"])
        with pytest.raises(InvalidJob, match="keys has 1 entries for 2 payloads"):
            enqueue_many(jobs.noop, [1, 2], keys=["k"])
        assert Job.objects.count() == 1

    def test_delay_applies_to_all(self):
        from django_jobs import enqueue_many

        enqueue_many(jobs.noop, [1, 2, 3], delay=120)
        assert (
            Job.objects.filter(run_at__gt=timezone.now() + dt.timedelta(seconds=100)).count() == 3
        )

    def test_empty_call_does_nothing(self):
        from django_jobs import enqueue_many

        assert enqueue_many(jobs.noop, []) == []
        assert enqueue_many(jobs.noop, payloads=[]) == []  # the documented keyword
