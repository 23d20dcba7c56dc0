"""Hostile handlers in an in-process worker: whatever they raise or return is a recorded outcome.

Each case of issue 10 ("What breaks today", points 1-4 and tampered rows):
BaseExceptions, unstorable results and messages, megabyte messages, malformed rows.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from django.db import connection

from django_jobs import enqueue
from django_jobs.attempts import MAX_MESSAGE, MAX_TRACEBACK
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Job,
)
from django_jobs.worker import Worker
from tests.conftest import ENGINE, POSTGRES, refused_poison_markers, wait_for
from tests.factories import JobFactory
from tests.testapp import hostile, jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

UNSTORABLE = "django_jobs.exceptions.UnstorableResult"
# A capped message keeps MAX_MESSAGE characters and a short note of how many were cut.
CAPPED = MAX_MESSAGE + 60


def burst(timeout=30.0, **options):
    """Run a burst worker on a thread; fail (instead of hanging) if it does not finish."""
    options.setdefault("burst", True)
    options.setdefault("concurrency", 1)
    worker = Worker(**options)
    returned = []  # run() returned rather than raised

    def target():
        worker.run()
        returned.append(True)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the burst worker did not finish within {timeout}s"
    assert returned == [True]
    return worker


def ordinary(n=3, prefix="ok"):
    return [enqueue(jobs.record, {"label": f"{prefix}-{i}"}).id for i in range(n)]


def set_errors(job_id, value):
    """Hand-edit a row's errors column to any JSON (JSON null included)."""
    cast = "::jsonb" if POSTGRES else ""
    key = job_id if POSTGRES else job_id.hex
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE django_jobs_job SET errors = %s{cast} WHERE id = %s", [json.dumps(value), key]
        )


def assert_ran_once(ids, prefix="ok"):
    assert CompletionMarker.objects.filter(job_id__in=ids).count() == len(ids)
    labels = Audit.objects.filter(label__startswith=f"{prefix}-").values_list("label", flat=True)
    assert sorted(labels) == sorted(f"{prefix}-{i}" for i in range(len(ids)))


# ---- 1. BaseExceptions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raised", ["KeyboardInterrupt", "SystemExit", "GeneratorExit", "HostileBase", "BadStr"]
)
@pytest.mark.parametrize("handler", [hostile.hostile, hostile.hostile_atomic])
def test_a_base_exception_is_a_failed_attempt_and_the_executor_lives_on(handler, raised):
    job = enqueue(handler, {"raise": raised, "message": "from the handler", "label": "h"})
    ids = ordinary()
    worker = burst()  # one executor: had it died, the ordinary jobs would never run
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 2)
    assert [e["type"] for e in letter.errors] == [hostile.RECORDED[raised]] * 2
    assert letter.error.startswith(hostile.RECORDED[raised])
    assert "Traceback" in letter.traceback and "_behave" in letter.traceback
    assert_ran_once(ids)
    # Atomic: both attempts' writes rolled back; plain: both happened.
    assert Audit.objects.filter(label="h").count() == (0 if handler.atomic else 2)
    assert (worker.stats.retried, worker.stats.dead, worker.stats.succeeded) == (1, 1, 3)
    assert not worker._inflight


def test_str_and_repr_that_raise_are_recorded_as_such():
    job = enqueue(hostile.hostile, {"raise": "BadStr"})
    burst()
    error = DeadLetter.objects.get(id=job.id).errors[-1]
    assert error["type"] == "tests.testapp.hostile.BadStr"
    assert error["message"] == "<BadStr object: str() failed>"
    assert "tests.testapp.hostile.BadStr: <exception str() failed>" in error["traceback"]


def test_an_exception_whose_traceback_cannot_be_formatted_is_recorded():
    job = enqueue(hostile.hostile, {"raise": "BadNotes", "message": "notes break"})
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    error = letter.errors[-1]
    assert (error["type"], error["message"]) == ("tests.testapp.hostile.BadNotes", "notes break")
    assert error["traceback"] == (
        "<the traceback could not be formatted: builtins.KeyboardInterrupt>"
    )
    assert_ran_once(ids)


def test_cancelled_error_in_an_async_handler_is_a_failed_attempt():
    job = enqueue(hostile.hostile_async, {"cancelled": True})
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    assert letter.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert [e["type"] for e in letter.errors] == ["asyncio.exceptions.CancelledError"] * 2
    assert Audit.objects.filter(label="cancelled").count() == 2
    assert_ran_once(ids)


def test_a_base_exception_raised_by_an_async_handler_is_a_failed_attempt():
    job = enqueue(hostile.hostile_async, {"raise": "KeyboardInterrupt", "message": "async"})
    burst()
    assert DeadLetter.objects.get(id=job.id).errors[-1]["type"] == "builtins.KeyboardInterrupt"


def test_a_validator_raising_a_base_exception_fails_the_attempt():
    # Enqueued as a row: enqueue() runs the validator too, in the caller's process.
    job = JobFactory(
        name="tests.hostile_validated",
        max_attempts=2,
        payload='{"validator": "raise", "raise": "KeyboardInterrupt"}',
    )
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 2)
    assert letter.error == "builtins.KeyboardInterrupt: raised by the validator"
    assert not Audit.objects.filter(label="validated-ran").exists()
    assert_ran_once(ids)


def test_a_validator_refusing_the_payload_is_still_invalid_payload():
    job = JobFactory(name="tests.hostile_validated", payload='{"validator": "invalid"}')
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, letter.attempts) == (DeadReason.INVALID_PAYLOAD, 1)


def test_the_lease_is_extended_only_while_a_thread_runs_the_job():
    """A KeyboardInterrupt: the job is settled (retry in an hour), not held by a dead thread."""
    job = enqueue(hostile.hostile_retry_later, {"raise": "KeyboardInterrupt"})
    worker = Worker(concurrency=1, lease=1.0, heartbeat=0.05, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        row = wait_for(
            lambda: Job.objects.filter(id=job.id, locked_by__isnull=True, attempts=1).first(),
            timeout=15,
            message="the failed attempt to be recorded and the lease given up",
        )
        assert row.errors[0]["type"] == "builtins.KeyboardInterrupt"
        assert row.lease_expires_at is None
        time.sleep(0.3)  # several heartbeats: nothing of this job may be held or extended
        assert not worker._inflight and not worker._held_back
        assert Job.objects.get(id=job.id).lease_expires_at is None
        # The single executor survived: the next job runs on it.
        ids = ordinary(1)
        wait_for(lambda: CompletionMarker.objects.filter(job_id__in=ids).exists(), timeout=15)
        executors = worker._executor.threads()
        assert [t.is_alive() for t in executors] == [True]
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()
    row = Job.objects.get(id=job.id)  # the shutdown gave nothing back
    assert (row.attempts, row.locked_by) == (1, None)


# ---- 2 and 3. Unstorable results and texts ----------------------------------------------------


@pytest.mark.parametrize(
    "returned",
    [
        {"kind": "dict", "value": {"text": "s", "surrogate": True}},  # {"s": "\ud800"}
        {"kind": "text", "text": "ab", "nul": True},  # "a\x00b"
        {"kind": "dict", "key": {"text": "key", "nul": True}},  # a NUL in a key
        {"kind": "nan"},
        {"kind": "inf"},
        {"kind": "set"},
        {"kind": "deep"},
    ],
    ids=["surrogate", "nul", "nul-key", "nan", "inf", "set", "deep"],
)
@pytest.mark.parametrize("handler", [hostile.hostile, hostile.hostile_atomic])
def test_an_unstorable_result_fails_the_attempt_with_unstorable_result(handler, returned):
    ids_before = ordinary(2, prefix="before")
    job = enqueue(handler, {"return": returned, "label": "h"})
    ids = ordinary()
    worker = burst(concurrency=2)
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 2)
    assert [e["type"] for e in letter.errors] == [UNSTORABLE] * 2
    assert letter.error.startswith(f"{UNSTORABLE}: the handler returned")
    # The jobs settled in the same batches were not failed, nor run again.
    assert_ran_once(ids)
    assert_ran_once(ids_before, prefix="before")
    assert Audit.objects.filter(label="h").count() == (0 if handler.atomic else 2)
    assert worker.stats.succeeded == 5
    assert Job.objects.count() == 0


def test_an_escaped_backslash_u0000_is_not_a_nul():
    job = enqueue(hostile.hostile, {"return": {"kind": "text", "text": "\\u0000 and \\\\u0000"}})
    burst()
    assert CompletionMarker.objects.get(job_id=job.id).result == "\\u0000 and \\\\u0000"


def test_a_payload_with_a_nul_echoed_back_is_unstorable_not_rerun():
    job = enqueue(hostile.hostile, {"return": {"json": "a\x00b"}, "label": "echo"})
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    assert letter.errors[-1]["type"] == UNSTORABLE
    assert "NUL" in letter.error
    assert Audit.objects.filter(label="echo").count() == 2  # two attempts, no silent re-runs


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("bad <SUR> char", "bad \ufffd char"),
        ({"text": "bad char", "nul": True}, "bad\ufffd char"),
    ],
    ids=["surrogate", "nul"],
)
def test_unstorable_characters_in_messages_are_replaced(message, expected):
    job = enqueue(hostile.hostile, {"raise": "ValueError", "message": message})
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=job.id)
    assert letter.error == f"builtins.ValueError: {expected}"
    assert [e["message"] for e in letter.errors] == [expected] * 2
    assert f"ValueError: {expected}" in letter.traceback
    assert_ran_once(ids)


# ---- 4. Megabyte messages ---------------------------------------------------------------------


def test_ten_megabyte_messages_are_capped_in_rows_and_logs(caplog):
    ids = [
        enqueue(
            hostile.hostile, {"raise": "ValueError", "message": {"text": "x", "repeat": 10**7}}
        ).id
        for _ in range(3)
    ]
    with caplog.at_level(logging.DEBUG, logger="django_jobs"):
        burst()
    letters = list(DeadLetter.objects.filter(id__in=ids))
    assert len(letters) == len(ids)  # else the loop below would check nothing
    for letter in letters:
        assert letter.errors
        assert len(letter.error) <= CAPPED
        assert "more characters cut" in letter.error
        assert len(letter.traceback) <= MAX_TRACEBACK + 1
        assert letter.traceback.startswith("Traceback")  # the frames kept, the message cut
        for error in letter.errors:
            assert len(error["message"]) <= CAPPED
            assert len(error["traceback"]) <= MAX_TRACEBACK + 1
    assert max(len(r.getMessage()) for r in caplog.records) < 30_000
    assert sum(len(r.getMessage()) for r in caplog.records) < 300_000


def test_a_refused_done_write_fails_only_its_own_job():
    """A done write the database refuses (a trigger here) is that job's failed attempt."""
    with refused_poison_markers():
        poisoned = enqueue(hostile.hostile, {"return": {"json": "poison"}, "label": "p"})
        ids = ordinary(6)
        started = time.monotonic()
        worker = burst(concurrency=4, batch=8)
        elapsed = time.monotonic() - started
    letter = DeadLetter.objects.get(id=poisoned.id)
    assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 2)
    assert "poisoned result" in letter.error  # the database's own words: the true cause
    assert_ran_once(ids)
    assert worker.stats.succeeded == 6
    assert elapsed < 10  # bounded: no retry loop


# ---- 6. Tampered rows ---------------------------------------------------------------------------


@pytest.mark.parametrize("errors", [[1, 2], "text", {"a": 1}, None, [{"ok": 1}, "x"]])
def test_a_row_with_hand_edited_errors_is_dead_lettered_as_malformed(errors):
    bad = JobFactory(name="tests.record", payload='{"label": "bad"}')
    set_errors(bad.id, errors)
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=bad.id)
    assert letter.reason == DeadReason.MALFORMED
    assert "its errors column is not a list of error objects" in letter.error
    assert letter.error.startswith("django_jobs.MalformedJob: the job row cannot be run")
    assert all(isinstance(e, dict) for e in letter.errors)
    assert not Audit.objects.filter(label="bad").exists()
    assert_ran_once(ids)


def test_an_expired_lease_over_hand_edited_errors_is_dead_lettered_as_malformed():
    """The claim's takeover appends to errors: on a string, too (as jsonb's || does)."""
    past = "2000-01-01T00:00:00Z"
    bad = JobFactory(name="tests.record", lease_expired=True, lease_expires_at=past)
    set_errors(bad.id, "text")
    ids = ordinary()
    burst()
    assert DeadLetter.objects.get(id=bad.id).reason == DeadReason.MALFORMED
    assert_ran_once(ids)


@pytest.mark.skipif(
    ENGINE != "sqlite",
    reason="only SQLite lets a hand edit put text in an integer column (not on MariaDB either)",
)
def test_a_row_with_text_in_an_integer_column_is_dead_lettered_as_malformed():
    bad = JobFactory(name="tests.record")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_job SET max_attempts = 'many' WHERE id = %s", [bad.id.hex]
        )
    ids = ordinary()
    burst()
    letter = DeadLetter.objects.get(id=bad.id)
    assert letter.reason == DeadReason.MALFORMED
    assert "its max_attempts column is not an integer: 'many'" in letter.error
    assert_ran_once(ids)
