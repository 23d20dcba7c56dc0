"""Unique for a period: @job(unique_for=...), enqueue(..., unique_for=..., unique_by=...).

A second enqueue inside the period is a duplicate of the first (live, finished or
retrying), race-free under concurrent transactions; a new period takes a new job.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_jobs import (
    IdempotencyConflict,
    InvalidJob,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    job,
    uniqueness,
    workflow,
)
from django_jobs.checks.operations import check_operations
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import unregister
from django_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

FIVE_MINUTES = timedelta(minutes=5)
RAN: list[object] = []


@pytest.fixture(autouse=True)
def handlers():
    # No test straddles two five-minute periods (it would see two jobs where it expects one).
    wait_for_fresh_period(300, room=15)
    RAN.clear()

    @job(name="tests.unique_sync", unique_for=FIVE_MINUTES, unique_by=("customer_id",))
    def sync_customer(payload, ctx):
        RAN.append(payload)

    @job(name="tests.unique_whole", unique_for=FIVE_MINUTES, max_attempts=1)
    def whole(payload, ctx):
        if payload == "fail":
            raise RuntimeError("fails")
        RAN.append(payload)

    @job(name="tests.unique_plain")
    def plain(payload, ctx):
        RAN.append(payload)

    yield {"sync": sync_customer, "whole": whole, "plain": plain}
    for name in ("tests.unique_sync", "tests.unique_whole", "tests.unique_plain"):
        unregister(name)


def wait_for_fresh_period(seconds: int, room: float = 0.6) -> None:
    """Sleep until at least `room` seconds are left in the current epoch-aligned period."""
    left = seconds - time.time() % seconds
    if left < room:
        time.sleep(left + 0.01)


# ---- declaration and enqueue: bad values refused before any SQL ----


@pytest.mark.parametrize(
    "value",
    [
        timedelta(0),
        timedelta(seconds=-5),
        timedelta(seconds=1.5),
        timedelta(days=400),
        300,
        300.0,
        "5m",
        True,
    ],
)
def test_a_bad_period_is_refused_at_declaration_and_at_enqueue(value, handlers):
    with pytest.raises(InvalidJob, match="unique_for"):
        job(name="tests.unique_bad", unique_for=value)(lambda payload, ctx: None)
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(InvalidJob, match="unique_for"),
    ):
        enqueue(handlers["plain"], {"x": 1}, unique_for=value)
    assert len(queries) == 0
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("unique_by", "match"),
    [
        ("customer_id", "tuple of payload keys"),
        ((), "at least one"),
        (("customer_id", 3), "payload keys are strings"),
        (("a", "a"), "twice"),
        ({"customer_id"}, "tuple of payload keys"),
    ],
)
def test_bad_unique_by_is_refused(unique_by, match, handlers):
    with pytest.raises(InvalidJob, match=match):
        job(name="tests.unique_bad", unique_for=FIVE_MINUTES, unique_by=unique_by)(
            lambda payload, ctx: None
        )
    with pytest.raises(InvalidJob, match=match):
        enqueue(handlers["plain"], {"a": 1}, unique_for=FIVE_MINUTES, unique_by=unique_by)


def test_unique_by_needs_a_period_and_is_not_combined_with_key(handlers):
    with pytest.raises(InvalidJob, match="unique_by needs unique_for"):
        job(name="tests.unique_bad", unique_by=("a",))(lambda payload, ctx: None)
    with pytest.raises(InvalidJob, match="key= or unique_by"):
        enqueue(handlers["plain"], {"a": 1}, key="k", unique_for=FIVE_MINUTES, unique_by=("a",))
    with pytest.raises(InvalidJob, match="keys= or unique_by"):
        enqueue_many(
            handlers["plain"], [{"a": 1}], keys=["k"], unique_for=FIVE_MINUTES, unique_by=("a",)
        )


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"name": "x"}, "lacks: customer_id"),
        ([42], "dict payload"),
        (None, "dict payload"),
        (42, "dict payload"),
    ],
)
def test_a_payload_without_the_unique_keys_is_refused_before_sql(payload, match, handlers):
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidJob, match=match):
        enqueue(handlers["sync"], payload)
    assert len(queries) == 0
    with pytest.raises(InvalidJob, match=match):
        enqueue_many(handlers["sync"], [{"customer_id": 1}, payload])
    assert Job.objects.count() == 0


def test_a_key_too_long_for_the_period_suffix_is_refused(handlers):
    with pytest.raises(InvalidJob, match="with unique_for the limit is 234"):
        enqueue(handlers["whole"], 1, key="k" * 235)
    enqueue(handlers["whole"], 1, key="k" * 234)


# ---- the period ----


def test_a_second_enqueue_in_the_period_is_a_duplicate_whatever_else_the_payload_says(handlers):
    sync = handlers["sync"]
    first = enqueue(sync, {"customer_id": 42, "reason": "signup"})
    again = enqueue(sync, {"reason": "edit", "customer_id": 42})
    other = enqueue(sync, {"customer_id": 43})
    assert first.duplicate is False and other.duplicate is False
    assert again.duplicate is True and again.id == first.id
    assert Job.objects.count() == 2
    row = Job.objects.get(id=first.id)
    start = uniqueness.period_start(FIVE_MINUTES, datetime.now(UTC))
    assert row.key == f"tests.unique_sync:{row.fingerprint[:32]}@{start:%Y-%m-%dT%H:%M:%SZ}"
    # The stored payload is the first one's, whole.
    assert row.payload == '{"customer_id":42,"reason":"signup"}'


def test_a_finished_job_holds_its_period_through_its_marker(handlers):
    sync = handlers["sync"]
    first = enqueue(sync, {"customer_id": 42})
    assert len(drain().succeeded) == 1
    again = enqueue(sync, {"customer_id": 42})
    assert again.duplicate is True and again.id == first.id
    assert Job.objects.count() == 0
    assert CompletionMarker.objects.get().job_id == first.id
    assert drain().attempts == []
    assert RAN == [{"customer_id": 42}]


def test_a_dead_lettered_job_frees_its_period(handlers):
    whole = handlers["whole"]
    first = enqueue(whole, "fail")
    assert len(drain().dead) == 1
    assert DeadLetter.objects.get().id == first.id
    again = enqueue(whole, "fail")
    assert again.duplicate is False and again.id != first.id


def test_whole_payload_by_default(handlers):
    whole = handlers["whole"]
    a = enqueue(whole, {"x": 1, "y": [1, 2]})
    b = enqueue(whole, {"y": [1, 2], "x": 1})  # key order does not matter
    c = enqueue(whole, {"x": 2, "y": [1, 2]})
    assert b.duplicate is True and b.id == a.id
    assert c.duplicate is False


def test_a_new_period_takes_a_new_job_even_while_the_first_is_live(handlers):
    period = timedelta(seconds=3)
    wait_for_fresh_period(3, room=2.5)
    first = enqueue(handlers["plain"], {"n": 1}, unique_for=period)
    assert enqueue(handlers["plain"], {"n": 1}, unique_for=period).duplicate is True
    time.sleep(3.05 - time.time() % 3)
    later = enqueue(handlers["plain"], {"n": 1}, unique_for=period)
    assert later.duplicate is False and later.id != first.id
    assert Job.objects.filter(locked_by__isnull=True).count() == 2


def test_a_call_level_period_on_a_plain_handler_and_the_handlers_period_through_every_path(
    handlers,
):
    plain, sync = handlers["plain"], handlers["sync"]
    a = enqueue(plain, {"n": 1}, unique_for=FIVE_MINUTES)
    assert enqueue(plain, {"n": 1}).duplicate is False  # no period: not unique
    assert enqueue(plain, {"n": 1}, unique_for=FIVE_MINUTES).id == a.id
    with transaction.atomic():
        b = enqueue_on_commit(sync, {"customer_id": 7})
        assert sync.enqueue_on_commit({"customer_id": 7}).id == b.id
    assert sync.enqueue({"customer_id": 7}).duplicate is True
    results = enqueue_many(sync, [{"customer_id": 7}, {"customer_id": 8}, {"customer_id": 8}])
    assert [r.duplicate for r in results] == [True, False, True]
    assert results[0].id == b.id and results[2].id == results[1].id
    with workflow(name="w") as w:
        step = w.enqueue(sync, {"customer_id": 9})
        twin = w.enqueue(sync, {"customer_id": 9, "other": 1})
    assert twin.id == step.id and twin.duplicate is True
    assert Job.objects.filter(name="tests.unique_sync").count() == 3


def test_an_explicit_key_is_unique_for_the_period_and_keeps_its_conflicts(handlers):
    whole = handlers["whole"]
    first = enqueue(whole, {"a": 1}, key="nightly-report")
    start = uniqueness.period_start(FIVE_MINUTES, datetime.now(UTC))
    assert Job.objects.get().key == f"nightly-report@{start:%Y-%m-%dT%H:%M:%SZ}"
    assert enqueue(whole, {"a": 1}, key="nightly-report").id == first.id
    with pytest.raises(IdempotencyConflict):
        enqueue(whole, {"a": 2}, key="nightly-report")
    # The handler's unique_by gives way to an explicit key.
    sync = handlers["sync"]
    k = enqueue(sync, {"customer_id": 1}, key="mine")
    assert Job.objects.get(id=k.id).key.startswith("mine@")
    results = enqueue_many(whole, [{"b": 1}, {"b": 1}], keys=["x", None])
    assert [r.duplicate for r in results] == [False, False]


def test_period_starts_are_aligned_to_the_epoch():
    at = datetime(2026, 12, 2, 5, 37, 12, 500000, tzinfo=UTC)
    assert uniqueness.period_start(FIVE_MINUTES, at) == datetime(2026, 12, 2, 5, 35, tzinfo=UTC)
    assert uniqueness.period_start(timedelta(days=1), at) == datetime(2026, 12, 2, tzinfo=UTC)
    assert uniqueness.period_start(timedelta(seconds=7), at).timestamp() % 7 == 0


# ---- races: real concurrent transactions ----


def test_a_second_enqueue_waits_for_the_first_transaction_then_is_its_duplicate(handlers):
    sync = handlers["sync"]
    entered, release = threading.Event(), threading.Event()
    results = {}

    def first():
        with transaction.atomic():
            results["first"] = enqueue(sync, {"customer_id": 5, "n": 1})
            entered.set()
            release.wait(10)
        connection.close()

    def second():
        entered.wait(10)
        results["second"] = enqueue(sync, {"customer_id": 5, "n": 2})
        connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    entered.wait(10)
    threads[1].join(0.5)
    assert threads[1].is_alive(), "the second enqueue must wait for the first transaction"
    release.set()
    for t in threads:
        t.join(20)
    assert results["second"].duplicate is True
    assert results["second"].id == results["first"].id
    assert Job.objects.count() == 1


def test_many_threads_racing_in_one_period_make_one_job(handlers):
    sync = handlers["sync"]
    barrier = threading.Barrier(6)
    results, errors = [], []

    def go(n):
        try:
            barrier.wait()
            results.append(enqueue(sync, {"customer_id": 99, "n": n}))
        except Exception as exc:  # a failure shows in the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len({r.id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert Job.objects.count() == 1


# ---- retention ----


def test_a_period_longer_than_marker_retention_is_warned_about(handlers):
    def ids():
        return [m.id for m in check_operations() if m.id == "django_jobs.W203"]

    assert ids() == []
    with override_settings(DJANGO_JOBS={"KEEP_MARKERS": 60}):
        [warning] = [m for m in check_operations() if m.id == "django_jobs.W203"]
        assert "tests.unique_sync" in warning.msg and "KEEP_MARKERS" in warning.msg
    with override_settings(DJANGO_JOBS={"KEEP_MARKERS": None}):
        assert ids() == []


# ---- combinations (r27) ----


def test_a_rolled_back_enqueue_frees_its_period(handlers):
    sync = handlers["sync"]
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit(sync, {"customer_id": 21})
        enqueue(sync, {"customer_id": 22})
        raise RuntimeError("roll back")
    assert not Job.objects.exists()
    assert enqueue(sync, {"customer_id": 21}).duplicate is False
    assert enqueue(sync, {"customer_id": 22}).duplicate is False
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many(sync, [{"customer_id": 23}, {"customer_id": 23}])
        raise RuntimeError("roll back")
    [made] = enqueue_many(sync, [{"customer_id": 23}])
    assert made.duplicate is False and Job.objects.count() == 3


def test_a_workflow_step_of_a_period_already_taken_is_the_existing_job(handlers):
    sync, plain = handlers["sync"], handlers["plain"]
    first = enqueue(sync, {"customer_id": 31})
    with workflow(name="w-dup") as w:
        step = w.enqueue(sync, {"customer_id": 31, "again": True})
        after = w.enqueue(plain, {"n": 1}, after=[step])
    # w.enqueue's result is the step's own; after the block, w.results names the holder.
    assert w.results[0].duplicate is True and w.results[0].id == first.id
    assert Job.objects.filter(name="tests.unique_sync").count() == 1
    drain()
    assert {"n": 1} in RAN and {"customer_id": 31} in RAN
    assert Job.objects.filter(id=after.id).exists() is False  # done, not stuck blocked


def test_a_one_second_period_and_the_longest_one(handlers):
    plain = handlers["plain"]
    wait_for_fresh_period(1, room=0.5)
    one = enqueue(plain, {"n": 2}, unique_for=timedelta(seconds=1))
    assert enqueue(plain, {"n": 2}, unique_for=timedelta(seconds=1)).id == one.id
    longest = uniqueness.MAX_PERIOD
    a = enqueue(plain, {"n": 3}, unique_for=longest)
    assert enqueue(plain, {"n": 3}, unique_for=longest).id == a.id
    key = Job.objects.get(id=a.id).key
    start = uniqueness.period_start(longest, datetime.now(UTC))
    assert key.endswith(f"@{start:%Y-%m-%dT%H:%M:%SZ}") and start <= datetime.now(UTC)
    with pytest.raises(InvalidJob):
        enqueue(plain, {"n": 3}, unique_for=timedelta.max)
