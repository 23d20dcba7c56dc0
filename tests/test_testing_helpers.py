"""django_jobs.testing: drain, perform and the enqueue assertions, inside tests' own transactions.

Most tests here run in pytest-django's default test transaction (what a TestCase
does: it never commits), the hard case for a queue: only the test's connection
sees the rows. TestCase and TransactionTestCase classes at the end use the
plain functions as unittest users would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from importlib.util import find_spec

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings

from django_jobs import FatalError, enqueue, enqueue_on_commit, job
from django_jobs.exceptions import InvalidJob, InvalidPayload, UnknownJob, UnstorableResult
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, QueueState
from django_jobs.testing import (
    MAX_ROUNDS,
    DrainError,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued_jobs,
    perform,
    task_payload,
)
from tests.conftest import ENGINE, POSTGRES, refused_poison_markers
from tests.factories import JobFactory, MarkerFactory
from tests.testapp import jobs as handlers
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db
SLOW_BACKOFF = {"BACKOFF": {"kind": "fixed", "base": 600, "ceiling": 600, "jitter": 0}}


@job(name="tests.helpers.loop")
def loop(payload, ctx):
    """Enqueue itself again: without a bound on rounds, drain() would never return."""
    Audit.objects.create(label="loop", job_id=ctx.id)
    enqueue(loop, {"n": payload["n"] + 1})


@job(name="tests.helpers.fan_out")
def fan_out(payload, ctx):
    for n in range(payload["children"]):
        enqueue(handlers.record, {"label": f"child-{n}"}, priority=payload.get("priority", 0))
    return payload["children"]


@job(name="tests.helpers.atomic_then_fail", atomic=True, max_attempts=2)
def atomic_then_fail(payload, ctx):
    Audit.objects.create(label=f"atomic-{ctx.attempt}", job_id=ctx.id, attempt=ctx.attempt)
    if ctx.attempt < payload["succeed_on"]:
        raise RuntimeError(f"fails on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@job(name="tests.helpers.duplicate_row", max_attempts=2)
def duplicate_row(payload, ctx):
    """Break the transaction with a failed statement (a unique violation), outside atomic."""
    with connection.cursor() as cursor:
        for _ in range(2):
            cursor.execute(
                "INSERT INTO django_jobs_queue (name, paused, paused_by, reason) "
                "VALUES ('dup', false, '', '')"
            )


@job(name="tests.helpers.slow_atomic", atomic=True, timeout=0.2, max_attempts=1)
def slow_atomic(payload, ctx):
    Audit.objects.create(label="slow-atomic", job_id=ctx.id)
    ctx.cancelled.wait(2)


@job(name="tests.helpers.returns", max_attempts=2)
def returns(payload, ctx):
    return payload


@job(name="tests.helpers.context", queue="emails")
def context(payload, ctx):
    return {"attempt": ctx.attempt, "max": ctx.max_attempts, "key": ctx.key, "q": ctx.queue}


# ---- what was enqueued ----------------------------------------------------------


def test_assert_enqueued_matches_name_payload_queue_key_and_count():
    first = enqueue(handlers.record, {"label": "a", "n": 1})
    enqueue(handlers.record, {"n": 1, "label": "a"}, key="twice")  # same payload, keys reordered
    enqueue(handlers.other_queue, {"label": "e"})

    found = assert_enqueued(handlers.record, {"label": "a", "n": 1}, count=2)
    assert [j.id for j in found][0] == first.id
    assert_enqueued("tests.record", key="twice")
    assert_enqueued(handlers.other_queue, queue="emails", count=1)
    assert len(enqueued_jobs()) == 3
    assert enqueued_jobs(handlers.record, key="twice")[0].key == "twice"
    # JSON tells 1, 1.0 and true apart, and so do the assertions.
    assert_not_enqueued(handlers.record, {"label": "a", "n": 1.0})
    assert_not_enqueued(handlers.record, {"label": "a", "n": True})
    assert_not_enqueued(handlers.record, queue="emails")
    assert_not_enqueued(handlers.noop)


def test_failed_assertions_list_what_was_enqueued_instead():
    enqueue(handlers.record, {"label": "b"}, priority=7, key="k-1")
    enqueue(handlers.noop, None, delay=3600)
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(handlers.record, {"label": "a"})
    message = str(failed.value)
    assert message.startswith(
        'expected a job tests.record with payload {"label":"a"} enqueued, found 0.'
    )
    assert "Enqueued jobs (2):" in message
    listed = """tests.record {"label":"b"} queue='default' priority=7 key='k-1' (waiting)"""
    assert listed in message
    assert "tests.noop null queue='default' priority=0 (scheduled)" in message

    with pytest.raises(AssertionError, match=r"expected 2 jobs tests.record enqueued, found 1"):
        assert_enqueued(handlers.record, count=2)
    with pytest.raises(AssertionError, match=r"expected no job tests.noop enqueued, found 1"):
        assert_not_enqueued(handlers.noop)
    with pytest.raises(AssertionError, match=r"expected no job \(any\) enqueued, found 2"):
        assert_not_enqueued()


def test_failed_assertion_on_an_empty_queue_says_so_and_long_lists_are_cut():
    with pytest.raises(AssertionError, match="No jobs are enqueued"):
        assert_enqueued(handlers.record)
    for n in range(25):
        enqueue(handlers.record, {"label": "x" * 300, "n": n})
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(handlers.noop)
    message = str(failed.value)
    assert "Enqueued jobs (25):" in message and "… and 5 more" in message
    assert max(len(line) for line in message.splitlines()) < 300  # payloads are cut


def test_assertions_refuse_what_is_not_a_handler():
    with pytest.raises(UnknownJob):
        assert_enqueued("tests.no_such_job")
    with pytest.raises(InvalidJob, match="expected a @job handler"):
        assert_enqueued(42)
    with pytest.raises(InvalidPayload):
        assert_enqueued(handlers.record, {"when": dt.datetime.now()})
    with pytest.raises(ValueError, match="count"):
        assert_enqueued(handlers.record, count=-1)


def test_enqueue_on_commit_in_the_test_transaction_is_visible_at_once(
    django_capture_on_commit_callbacks,
):
    # The test's transaction never commits, yet the job is there: enqueue_on_commit
    # writes its row at once in the current transaction, not in an on_commit callback.
    with django_capture_on_commit_callbacks() as callbacks:
        with transaction.atomic():
            enqueue_on_commit(handlers.record, {"label": "on-commit"})
    assert callbacks == []
    assert_enqueued(handlers.record, {"label": "on-commit"})
    summary = drain()
    assert [a.payload for a in summary.succeeded] == [{"label": "on-commit"}]
    assert Audit.objects.get().label == "on-commit"


@pytest.mark.django_db(databases=["default", "other"])
def test_only_commit_of_another_alias_waits_for_a_commit(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(using="other", execute=True) as callbacks:
        enqueue_on_commit(handlers.record, {"label": "other"}, commit_of="other")
        assert_not_enqueued()  # written when "other" commits, which a test never does
    assert len(callbacks) == 1
    assert_enqueued(handlers.record, {"label": "other"})
    assert len(drain().succeeded) == 1


# ---- drain: the worker's outcomes ---------------------------------------------------


def test_drain_runs_jobs_and_writes_their_markers():
    first = enqueue(handlers.record, {"label": "one"})
    second = enqueue(handlers.record, {"label": "two"}, key="second")
    summary = drain()
    assert [(a.id, a.outcome, a.result, a.attempt) for a in summary.attempts] == [
        (first.id, "succeeded", {"label": "one"}, 1),
        (second.id, "succeeded", {"label": "two"}, 1),
    ]
    assert summary.retried == summary.dead == [] and summary.rounds == 1
    assert str(summary) == "2 succeeded, 0 retried, 0 dead, 0 snoozed in 1 round(s)"
    assert not Job.objects.exists()
    markers = {m.key: m for m in CompletionMarker.objects.all()}
    assert markers[str(first.id)].result == {"label": "one"}
    assert markers["second"].job_id == second.id and markers["second"].attempts == 1
    assert enqueue(handlers.record, {"label": "two"}, key="second").duplicate is True
    assert drain().attempts == []


def test_retries_and_dead_letters_through_drain():
    flaky = enqueue(handlers.flaky, {"succeed_on": 2})
    doomed = enqueue(handlers.flaky, {})  # max_attempts=3, never succeeds
    fatal = enqueue(handlers.fatal, {})
    summary = drain()  # the tests' backoff is 0s: retries are due at once
    assert [(a.id, a.attempt) for a in summary.retried] == [
        (flaky.id, 1),
        (doomed.id, 1),
        (doomed.id, 2),
    ]
    assert all(isinstance(a.error, RuntimeError) for a in summary.retried)
    assert [(a.id, a.result) for a in summary.succeeded] == [(flaky.id, 2)]
    dead = {a.id: a for a in summary.dead}
    assert dead[doomed.id].reason == DeadReason.ATTEMPTS_EXHAUSTED and dead[doomed.id].attempt == 3
    assert dead[fatal.id].reason == DeadReason.FATAL
    assert isinstance(dead[fatal.id].error, FatalError)
    letter = DeadLetter.objects.get(id=doomed.id)
    assert [e["attempt"] for e in letter.errors] == [1, 2, 3]
    assert letter.error == "builtins.RuntimeError: flaky failure on attempt 3"
    assert CompletionMarker.objects.get().attempts == 2
    assert not Job.objects.exists()


def test_a_retry_waiting_for_its_backoff_runs_only_when_asked():
    with override_settings(DJANGO_JOBS=SLOW_BACKOFF):
        result = enqueue(handlers.flaky, {"succeed_on": 2})
        summary = drain()
        assert [a.outcome for a in summary.attempts] == ["retried"]
        waiting = Job.objects.with_state().get(id=result.id)
        assert (waiting.state, waiting.attempts, len(waiting.errors)) == ("scheduled", 1, 1)
        assert drain().attempts == []
        summary = drain(run_scheduled=True)
        assert [(a.outcome, a.attempt) for a in summary.attempts] == [("succeeded", 2)]


def test_a_scheduled_job_is_left_alone_unless_asked():
    later = enqueue(handlers.record, {"label": "later"}, delay=dt.timedelta(days=1))
    now = enqueue(handlers.record, {"label": "now"})
    assert [a.id for a in drain().attempts] == [now.id]
    assert_enqueued(handlers.record, {"label": "later"})
    assert [a.id for a in drain(until_empty=False).attempts] == []
    assert [a.id for a in drain(run_scheduled=True).attempts] == [later.id]
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == ["now", "later"]


def test_priorities_are_respected_across_queues():
    enqueue(handlers.record, {"label": "low"}, priority=-50)
    enqueue(handlers.record, {"label": "urgent"}, priority=90, queue="emails")
    enqueue(handlers.record, {"label": "normal"})
    enqueue(handlers.record, {"label": "high"}, priority=10)
    drain()
    labels = list(Audit.objects.order_by("id").values_list("label", flat=True))
    assert labels == ["urgent", "high", "normal", "low"]


def test_drain_one_queue_leaves_the_others():
    enqueue(handlers.record, {"label": "default"})
    enqueue(handlers.other_queue, {})
    assert [a.name for a in drain("emails").attempts] == ["tests.other_queue"]
    assert_enqueued(handlers.record)
    assert [a.name for a in drain(["default", "emails"]).attempts] == ["tests.record"]
    with pytest.raises(InvalidJob):
        drain("no spaces allowed")
    with pytest.raises(InvalidJob):
        drain([])
    with pytest.raises(InvalidJob, match="needs a queue name"):
        drain(42)


def test_a_paused_queue_is_left_alone_as_by_the_worker():
    QueueState.objects.create(name="default", paused=True)
    enqueue(handlers.record, {"label": "paused"})
    assert drain().attempts == []
    QueueState.objects.filter(name="default").update(paused=False)
    assert len(drain().succeeded) == 1


def test_atomic_handlers_roll_back_their_effects_on_failure():
    result = enqueue(atomic_then_fail, {"succeed_on": 2})
    summary = drain()
    assert [(a.outcome, a.attempt) for a in summary.attempts] == [("retried", 1), ("succeeded", 2)]
    # The first attempt's row was rolled back with its savepoint; the second's kept.
    assert list(Audit.objects.values_list("label", flat=True)) == ["atomic-2"]
    marker = CompletionMarker.objects.get(job_id=result.id)
    assert marker.result == {"attempt": 2}

    enqueue(atomic_then_fail, {"succeed_on": 3})
    summary = drain()
    assert [a.outcome for a in summary.attempts] == ["retried", "dead"]
    assert list(Audit.objects.values_list("label", flat=True)) == ["atomic-2"]


def test_a_handler_that_breaks_the_transaction_fails_only_its_attempt():
    # On PostgreSQL a failed statement aborts the test's transaction; drain() runs
    # handlers in a savepoint that it rolls back then, so the test goes on.
    enqueue(duplicate_row, {})
    enqueue(handlers.record, {"label": "after"})
    summary = drain()
    assert [a.outcome for a in summary.attempts if a.name == duplicate_row.name] == [
        "retried",
        "dead",
    ]
    assert all(isinstance(a.error, IntegrityError) for a in summary.attempts if a.error)
    assert Audit.objects.get().label == "after"
    # PostgreSQL: the aborted savepoint took the first INSERT with it. SQLite goes on
    # after a failed statement, so the first INSERT stays, as it would in production.
    assert QueueState.objects.filter(name="dup").exists() is not POSTGRES
    assert DeadLetter.objects.get().reason == DeadReason.ATTEMPTS_EXHAUSTED


# DDL commits at once on MariaDB: there the test cannot run in a transaction.
@pytest.mark.django_db(transaction=ENGINE == "mariadb")
def test_a_settle_the_database_refuses_fails_only_its_job():
    # A trigger refuses the done write of one result: the worker records that attempt
    # as failed; in the test's transaction, the refused statement is rolled back alone.
    with refused_poison_markers():
        poisoned = enqueue(returns, "poison")
        fine = enqueue(returns, "fine")
        summary = drain()
    assert [(a.id, a.outcome) for a in summary.attempts] == [
        (poisoned.id, "retried"),
        (fine.id, "succeeded"),
        (poisoned.id, "dead"),
    ]
    assert "poisoned result" in DeadLetter.objects.get(id=poisoned.id).error
    assert CompletionMarker.objects.get().result == "fine"


def test_raise_errors_raises_in_the_test_and_records_no_attempt():
    ok = enqueue(handlers.record, {"label": "first"}, priority=10)
    failing = enqueue(handlers.flaky, {"succeed_on": 2})
    after = enqueue(handlers.record, {"label": "after"}, priority=-10)
    with pytest.raises(RuntimeError, match="flaky failure on attempt 1"):
        drain(raise_errors=True)
    # The job before it settled; the failing one and the one after are back, unattempted.
    assert CompletionMarker.objects.filter(job_id=ok.id).exists()
    rows = {j.id: j for j in Job.objects.with_state()}
    assert set(rows) == {failing.id, after.id}
    assert all((j.attempts, j.errors, j.state) == (0, [], "waiting") for j in rows.values())
    assert not DeadLetter.objects.exists()

    with pytest.raises(FatalError):
        enqueue(handlers.fatal, {}, priority=100)
        drain(raise_errors=True)
    assert not DeadLetter.objects.exists()
    summary = drain()  # without raise_errors: the attempts are recorded
    assert len(summary.succeeded) == 2 and len(summary.dead) == 1


def test_ctrl_c_in_a_handler_stops_the_test():
    # The worker records any BaseException as a failed attempt; a test must stop on Ctrl-C.
    @job(name="tests.helpers.interrupted")
    def interrupted(payload, ctx):
        raise KeyboardInterrupt

    result = enqueue(interrupted, {})
    with pytest.raises(KeyboardInterrupt):
        drain()
    row = Job.objects.get(id=result.id)
    assert (row.attempts, row.locked_by, row.errors) == (0, None, [])


def test_jobs_a_handler_enqueues_run_too_unless_until_empty_is_false():
    enqueue(fan_out, {"children": 3})
    summary = drain(until_empty=False)
    assert [a.name for a in summary.attempts] == ["tests.helpers.fan_out"]
    assert_enqueued(handlers.record, count=3)
    enqueue(fan_out, {"children": 2, "priority": 5})
    summary = drain()
    assert summary.rounds == 2
    # Round 1: what was due (claim order: priority, then enqueue time); round 2: the new children.
    names = [a.name for a in summary.attempts]
    assert names == [handlers.record.name] * 3 + [fan_out.name] + [handlers.record.name] * 2
    assert Audit.objects.count() == 5
    assert_not_enqueued()


def test_a_self_enqueueing_handler_cannot_hang_the_test():
    enqueue(loop, {"n": 0})
    with pytest.raises(DrainError) as stopped:
        drain()
    message = str(stopped.value)
    assert f"drain() stopped after {MAX_ROUNDS} rounds" in message
    assert "tests.helpers.loop x1" in message and "pass a larger max_rounds" in message
    assert len(stopped.value.drained.succeeded) == MAX_ROUNDS
    assert Audit.objects.count() == MAX_ROUNDS

    with pytest.raises(DrainError, match="stopped after 3 rounds"):
        drain(max_rounds=3)
    # Jobs that cannot run (a paused queue) do not count as work left.
    QueueState.objects.create(name="default", paused=True)
    enqueue(handlers.other_queue, {})
    assert len(drain(max_rounds=1).succeeded) == 1
    with pytest.raises(ValueError, match="max_rounds"):
        drain(max_rounds=0)


def test_a_fan_out_without_end_is_bounded_too():
    @job(name="tests.helpers.doubling")
    def doubling(payload, ctx):
        enqueue(doubling, {})
        enqueue(doubling, {})

    enqueue(doubling, {})
    with pytest.raises(DrainError) as stopped:
        drain(max_rounds=5)
    assert len(stopped.value.drained.attempts) <= 5 * 100


def test_drain_goes_through_the_worker_checks_before_running():
    # An unknown name, a completed key and an invalid payload: what the worker does
    # (a name no handler has is not claimed: it waits, see test_rolling_deploy.py).
    unknown = JobFactory(name="tests.gone", payload="{}")
    MarkerFactory(key="done-before", name="tests.record", result={"label": "old"})
    skipped = JobFactory(name="tests.record", key="done-before", payload='{"label": "new"}')
    invalid = JobFactory(name="tests.validated", payload='{"n": -1}')
    summary = drain()
    outcomes = {a.id: a for a in summary.attempts}
    assert unknown.id not in outcomes
    assert Job.objects.filter(id=unknown.id, attempts=0, locked_by__isnull=True).exists()
    assert outcomes[invalid.id].reason == DeadReason.INVALID_PAYLOAD
    assert (outcomes[skipped.id].outcome, outcomes[skipped.id].result) == (
        "succeeded",
        {"label": "old"},
    )
    assert not Audit.objects.exists()  # nothing ran


def test_timeouts_fail_the_attempt_as_in_the_worker():
    # tests.timeout waits on ctx.cancelled for 5s; its timeout is 0.5s, 2 attempts.
    enqueue(handlers.slow, {})
    summary = drain()
    assert [a.outcome for a in summary.attempts] == ["retried", "dead"]
    assert all(isinstance(a.error, TimeoutError) for a in summary.attempts)
    labels = list(Audit.objects.values_list("label", flat=True))
    assert labels == ["slow-start", "slow-late-end"] * 2  # it returned when cancelled


def test_an_atomic_handler_past_its_timeout_is_rolled_back_as_in_the_worker():
    enqueue(slow_atomic, {})
    [dead] = drain().dead
    assert (dead.reason, type(dead.error)) == (DeadReason.ATTEMPTS_EXHAUSTED, TimeoutError)
    assert not Audit.objects.exists()
    assert not CompletionMarker.objects.exists()


def test_async_handlers_run_in_the_test_thread():
    enqueue(handlers.async_record, {"label": "async"})
    assert [a.result for a in drain().succeeded] == ["async-ok"]
    assert Audit.objects.get().label == "async"


@job(name="tests.helpers.async_slow", timeout=0.3, max_attempts=1)
async def async_slow(payload, ctx):
    await Audit.objects.acreate(label="start", job_id=ctx.id)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await Audit.objects.acreate(label=f"cancelled, ctx.cancelled {ctx.is_cancelled}")
        raise
    await Audit.objects.acreate(label="end")


@job(name="tests.helpers.async_stubborn", timeout=0.2, max_attempts=1)
async def async_stubborn(payload, ctx):
    """Swallow the cancellation and return later: the attempt has timed out all the same."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.sleep(0.2)
    await Audit.objects.acreate(label="returned late")
    return "late"


@job(name="tests.helpers.async_steps")
async def async_steps(payload, ctx):
    for step in ("start", "end"):
        await Audit.objects.acreate(label=f"{payload['n']}-{step}")
        await asyncio.sleep(0.01)


@job(name="tests.helpers.async_inner_cancel", max_attempts=1)
async def async_inner_cancel(payload, ctx):
    """Await a task something else cancelled: the handler's own CancelledError, not a timeout."""
    inner = asyncio.ensure_future(asyncio.sleep(30))
    asyncio.get_running_loop().call_soon(inner.cancel)
    await inner


def test_an_async_handler_past_its_timeout_has_its_task_cancelled(caplog):
    enqueue(async_slow, {})
    started = time.monotonic()
    [dead] = drain().dead
    assert time.monotonic() - started < 10  # not the handler's 30 s
    assert (dead.reason, type(dead.error)) == (DeadReason.ATTEMPTS_EXHAUSTED, TimeoutError)
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == [
        "start",
        "cancelled, ctx.cancelled True",
    ]
    assert "its task is cancelled" in caplog.text


def test_an_async_handler_that_swallows_its_cancellation_has_still_timed_out():
    enqueue(async_stubborn, {})
    summary = drain()
    [dead] = summary.dead
    assert type(dead.error) is TimeoutError
    assert not summary.succeeded
    assert Audit.objects.get().label == "returned late"  # it ran on; its result is discarded
    assert not CompletionMarker.objects.exists()


def test_async_handlers_run_one_at_a_time_in_claim_order():
    for n in range(3):
        enqueue(async_steps, {"n": n}, priority=n)
    assert len(drain().succeeded) == 3
    labels = list(Audit.objects.order_by("id").values_list("label", flat=True))
    assert labels == [f"{n}-{step}" for n in (2, 1, 0) for step in ("start", "end")]


def test_an_async_handlers_own_cancelled_error_is_a_failed_attempt_not_a_timeout():
    enqueue(async_inner_cancel, {})
    [dead] = drain().dead
    assert isinstance(dead.error, asyncio.CancelledError)


# ---- perform -----------------------------------------------------------------


def test_perform_runs_a_handler_without_enqueueing():
    assert perform(handlers.record, {"label": "p"}) == {"label": "p"}
    assert Audit.objects.get().label == "p"
    assert not Job.objects.exists() and not CompletionMarker.objects.exists()
    assert perform(context, None, key="k", attempt=3, max_attempts=4) == {
        "attempt": 3,
        "max": 4,
        "key": "k",
        "q": "emails",
    }
    assert perform("tests.helpers.context", queue="default")["q"] == "default"


def test_perform_raises_what_the_handler_raises_and_rolls_back_atomic_effects():
    with pytest.raises(RuntimeError, match="fails on attempt 1"):
        perform(atomic_then_fail, {"succeed_on": 2})
    assert not Audit.objects.exists()
    assert perform(atomic_then_fail, {"succeed_on": 2}, attempt=2) == {"attempt": 2}
    with pytest.raises(FatalError):
        perform(handlers.fatal, {})


def test_perform_validates_and_encodes_as_enqueue_and_the_worker_do():
    with pytest.raises(InvalidPayload, match="validator"):
        perform(handlers.validated, {"n": -1})
    with pytest.raises(InvalidPayload, match="not JSON"):
        perform(handlers.record, {"label": {1, 2}})
    with pytest.raises(InvalidPayload, match="lone surrogate"):
        perform(handlers.record, {"label": "\ud800"})
    with pytest.raises(UnstorableResult, match="not JSON"):
        perform(handlers.bad_return, {})
    with pytest.raises(InvalidJob, match="attempt"):
        perform(handlers.noop, {}, attempt=0)
    with pytest.raises(InvalidJob, match="key"):
        perform(handlers.noop, {}, key="")
    with pytest.raises(TypeError):
        perform(handlers.noop, {}, delay=5)  # not an option of perform


# ---- django.tasks ---------------------------------------------------------------

needs_tasks = pytest.mark.skipif(find_spec("django.tasks") is None, reason="Django >= 6.0")


@needs_tasks
def test_tasks_are_accepted_and_their_results_read_back_after_drain():
    from django.tasks import TaskResultStatus

    from tests.testapp import tasks

    enqueued = tasks.add.enqueue(2, 3)
    assert_enqueued(tasks.add, task_payload(2, 3))
    assert_enqueued(tasks.add, {"args": [2, 3], "kwargs": {}}, count=1)
    assert_not_enqueued(tasks.add, task_payload(3, 2))
    summary = drain()
    assert [a.name for a in summary.succeeded] == [tasks.add.module_path]
    result = tasks.add.get_result(enqueued.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert perform(tasks.add, task_payload(20, 22)) == 42
    with pytest.raises(InvalidJob, match="does not run on django-jobs"):
        assert_enqueued(tasks.add.using(backend="immediate"))


@needs_tasks
def test_a_failing_task_reads_back_failed_after_drain():
    from django.tasks import TaskResultStatus

    from tests.testapp import tasks

    enqueued = tasks.flaky.enqueue(succeed_on=5)  # explode-free: MAX_ATTEMPTS 3 in OPTIONS
    summary = drain()
    assert [a.outcome for a in summary.attempts] == ["retried", "retried", "dead"]
    result = tasks.flaky.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED and len(result.errors) == 3


# ---- unittest: TestCase and TransactionTestCase -------------------------------------


class InTestCase(TestCase):
    def test_drain_inside_a_transaction_that_never_commits(self):
        with self.captureOnCommitCallbacks() as callbacks:
            enqueue_on_commit(handlers.record_atomic, {"label": "tc"})
        self.assertEqual(callbacks, [])
        assert_enqueued(handlers.record_atomic, {"label": "tc"})
        summary = drain()
        self.assertEqual(len(summary.succeeded), 1)
        self.assertEqual(Audit.objects.get().label, "tc")
        assert_not_enqueued()


class InTransactionTestCase(TransactionTestCase):
    def test_drain_commits_as_the_worker_does(self):
        enqueue(handlers.flaky, {"succeed_on": 2})
        summary = drain()
        self.assertEqual([a.outcome for a in summary.attempts], ["retried", "succeeded"])
        self.assertTrue(connection.get_autocommit())
        # Committed: a second connection sees the marker.
        from django.db import connections

        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT result FROM django_jobs_marker")
                (result,) = cursor.fetchone()
        finally:
            other.close()
        self.assertEqual(json.loads(result) if isinstance(result, str) else result, 2)
