"""Every option is checked against django_jobs.limits before any SQL runs, with the library's error.

enqueue, enqueue_on_commit, enqueue_many, @job, Backoff, Worker, the DJANGO_JOBS system
checks and the smaller APIs (Snooze, extend_lease, replay, schedules) refuse values
the database cannot store or add to now(), and the limits themselves work end to end.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from django_jobs import (
    Backoff,
    InvalidJob,
    JobsError,
    Snooze,
    control,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    job,
    limits,
)
from django_jobs.context import JobContext
from django_jobs.models import DeadLetter, Job
from django_jobs.registry import all_handlers, unregister
from django_jobs.worker import Worker
from tests.factories import DeadLetterFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(databases=["default", "other", "jobs2"])

HUGE_INT = 2**40
BAD_SECONDS = [1e13, 10**400, float("inf"), float("nan"), -1, -1e-9, True, "5", None]
BAD_DELAYS = [1e13, 10**400, float("inf"), float("nan"), -1, timedelta(days=999_999_999)]


def _still_usable():
    """The caller's transaction is not aborted: a query still runs in it."""
    assert Job.objects.count() == 0


# ---- enqueue ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_attempts": HUGE_INT}, "max_attempts"),
        ({"max_attempts": 2**31}, "max_attempts"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 10**400}, "max_attempts"),
        ({"priority": HUGE_INT}, "priority"),
        ({"priority": 101}, "priority"),
        ({"priority": 1.5}, "priority"),
        *[({"delay": delay}, "delay") for delay in BAD_DELAYS],
        ({"run_at": datetime(1, 1, 1, tzinfo=UTC) + timedelta(hours=1)}, "run_at"),
        ({"run_at": datetime(9999, 12, 31, tzinfo=UTC)}, "run_at"),
        ({"queue": "q" * (limits.MAX_QUEUE_LENGTH + 1)}, "queue"),
        ({"key": "k" * (limits.MAX_KEY_LENGTH + 1)}, "key"),
        ({"key": "a\x00b"}, "key"),
    ],
)
@pytest.mark.parametrize("api", ["enqueue", "enqueue_on_commit", "enqueue_many"])
def test_enqueue_refuses_values_out_of_range_before_any_sql(
    api, options, named, django_assert_num_queries
):
    options = dict(options)
    with transaction.atomic():
        with django_assert_num_queries(0), pytest.raises(InvalidJob) as error:
            if api == "enqueue_many":
                keys = [options.pop("key")] if "key" in options else None
                enqueue_many(jobs.noop, [1], keys=keys, **options)
            else:
                {"enqueue": enqueue, "enqueue_on_commit": enqueue_on_commit}[api](
                    jobs.noop, **options
                )
        assert named in str(error.value)
        assert isinstance(error.value, ValueError)
        _still_usable()


def test_the_messages_name_the_option_and_its_range():
    with pytest.raises(
        InvalidJob, match=r"max_attempts must be a whole number from 1 to 2147483647"
    ):
        enqueue(jobs.noop, max_attempts=HUGE_INT)
    with pytest.raises(
        InvalidJob, match=r"delay must be a number of seconds from 0 up to 315360000 .*run_at"
    ):
        enqueue(jobs.noop, delay=10**400)
    with pytest.raises(InvalidJob, match=r"priority must be a whole number from -100 to 100"):
        enqueue(jobs.noop, priority=HUGE_INT)


def test_a_huge_default_max_attempts_is_refused_at_enqueue_and_by_check():
    with override_settings(DJANGO_JOBS={"MAX_ATTEMPTS": HUGE_INT}):
        with pytest.raises(InvalidJob, match="max_attempts"):
            enqueue(jobs.noop)
    assert "django_jobs.E004" in _check_ids(MAX_ATTEMPTS=HUGE_INT)
    assert Job.objects.count() == 0


def test_the_limits_themselves_are_stored_and_read_back():
    name = "n" * limits.MAX_NAME_LENGTH
    handler = job(name=name)(lambda payload, ctx: None)
    try:
        result = enqueue(
            handler,
            key="k" * limits.MAX_KEY_LENGTH,
            queue="q" * limits.MAX_QUEUE_LENGTH,
            priority=limits.MIN_PRIORITY,
            max_attempts=limits.MAX_INT,
            delay=limits.MAX_SECONDS,
        )
        enqueue_many(handler, [1, 2], max_attempts=limits.MAX_INT, delay=limits.MAX_SECONDS)
        enqueue(handler, priority=limits.MAX_PRIORITY, run_at=limits.LATEST_RUN_AT)
    finally:
        unregister(name)
    row = Job.objects.get(id=result.id)
    assert row.max_attempts == limits.MAX_INT
    assert row.run_at - row.enqueued_at == timedelta(seconds=limits.MAX_SECONDS)
    assert Job.objects.filter(max_attempts=limits.MAX_INT).count() == 3


# ---- @job and Backoff ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": HUGE_INT},
        {"max_attempts": 0},
        {"priority": HUGE_INT},
        {"queue": "q" * 101},
        *[{"timeout": value} for value in BAD_SECONDS if value is not None],
        {"timeout": 0},
        {"concurrency": 10**6},
        {"concurrency": 0},
        {"backoff": 1e13},
        {"backoff": float("nan")},
        {"backoff": {"kind": "exponential", "base": 1, "ceiling": float("inf")}},
        {"backoff": {"kind": "exponential", "base": 2, "ceiling": 1, "jitter": 0}},
        {"backoff": {"kind": "fixed", "base": 1, "ceiling": 1, "jitter": float("nan")}},
        {"backoff": {"kind": "fixed", "base": "1", "ceiling": 1}},
        {"backoff": {"kind": "fixed", "base": 1, "ceiling": 1, "colour": "red"}},
    ],
)
def test_job_declarations_out_of_range_are_refused(options):
    before = set(all_handlers())
    with pytest.raises(InvalidJob):
        job(name="tests.option_limits", **options)(lambda payload, ctx: None)
    assert set(all_handlers()) == before


@pytest.mark.parametrize("value", [1e13, 10**400, float("inf"), float("nan"), -1, "1"])
def test_backoff_refuses_durations_out_of_range(value):
    with pytest.raises(ValueError, match="backoff"):
        Backoff.fixed(value)
    with pytest.raises(ValueError, match="backoff"):
        Backoff.exponential(base=1, ceiling=value)


def test_backoff_at_the_limit_gives_storable_retries():
    backoff = Backoff.exponential(base=limits.MAX_SECONDS, ceiling=limits.MAX_SECONDS)
    assert backoff.delay(10**6) <= limits.MAX_SECONDS


# ---- the worker -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"lease": 1e13},
        {"lease": float("inf")},
        {"lease": float("nan")},
        {"lease": -5},
        {"heartbeat": 1e13},
        {"heartbeat": -1},
        {"lease": 10, "heartbeat": 10},
        {"grace": 1e13},
        {"grace": float("nan")},
        {"poll_interval": 1e13},
        {"poll_interval": -1},
        {"concurrency": 10**6},
        {"concurrency": -1},
        {"async_concurrency": 10**6},
        {"async_concurrency": -1},
        {"batch": HUGE_INT},
        {"max_jobs": HUGE_INT},
        {"max_jobs": 0},
        {"queues": ["bad queue"]},
    ],
)
def test_worker_refuses_options_out_of_range_before_any_sql(options, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ImproperlyConfigured, match="Worker: "):
        Worker(burst=True, **options)


@pytest.mark.parametrize("setting", ["LEASE", "GRACE", "POLL_INTERVAL", "HEARTBEAT"])
def test_worker_refuses_settings_out_of_range(setting):
    with override_settings(DJANGO_JOBS={setting: 1e13}):
        with pytest.raises(ImproperlyConfigured, match=setting.lower()):
            Worker(burst=True)


def test_runjobs_with_checks_skipped_answers_a_bad_setting_with_exit_code_2():
    with override_settings(DJANGO_JOBS={"LEASE": 1e13}):
        with pytest.raises(CommandError, match="lease") as error:
            call_command("runjobs", "--burst", skip_checks=True)
    assert error.value.returncode == 2


@pytest.mark.django_db(transaction=True)
def test_a_worker_at_the_limits_runs_its_jobs(run_worker):
    enqueue(jobs.record, {"label": "far"})
    enqueue(jobs.flaky, {"succeed_on": 2})
    with override_settings(
        DJANGO_JOBS={
            "BACKOFF": {"kind": "fixed", "base": 0, "ceiling": limits.MAX_SECONDS, "jitter": 0},
            "POLL_INTERVAL": 0.2,
        }
    ):
        worker = run_worker(lease=limits.MAX_SECONDS, grace=limits.MAX_SECONDS)
    assert worker.stats.succeeded == 2
    assert worker.stats.retried == 1
    assert Job.objects.count() == 0


# ---- settings checks ----------------------------------------------------------------------------


def _check_ids(**jobs_settings):
    with override_settings(DJANGO_JOBS=jobs_settings):
        return {m.id for m in run_checks() if m.id.startswith("django_jobs")}


@pytest.mark.parametrize(
    ("jobs_settings", "check_id"),
    [
        ({"LEASE": 1e13}, "E005"),
        ({"LEASE": float("nan")}, "E005"),
        ({"LEASE": 10**400}, "E005"),
        ({"GRACE": 1e13}, "E005"),
        ({"POLL_INTERVAL": float("inf")}, "E005"),
        ({"TIMEOUT": 1e13}, "E006"),
        ({"TIMEOUT": float("nan")}, "E006"),
        ({"HEARTBEAT": 1e13}, "E007"),
        ({"HEARTBEAT": float("nan")}, "E007"),
        ({"CONCURRENCY": 5000}, "E004"),
        ({"BATCH": 2**31}, "E004"),
        ({"MAX_ATTEMPTS": 2**31}, "E004"),
        ({"BACKOFF": {"kind": "fixed", "base": 1, "ceiling": 1e13}}, "E009"),
        ({"BACKOFF": 1e13}, "E009"),
        ({"DEFAULT_QUEUE": "a b"}, "E010"),
        ({"DEFAULT_QUEUE": ""}, "E010"),
        ({"MAX_PAYLOAD_BYTES": HUGE_INT}, "E011"),
        ({"CHANNEL": "c" * 64}, "E014"),
        ({"CHANNEL": 'a"b'}, "E014"),
        ({"CHANNEL": ""}, "E014"),
        ({"DATABASE": ["default"]}, "E003"),
        ({"KEEP_MARKERS": 1e13}, "E203"),
        ({"KEEP_MARKERS": "900000000d"}, "E203"),
        ({"KEEP_DEAD_LETTERS": timedelta(days=999_999_999)}, "E203"),
        ({"PRUNE_BATCH": HUGE_INT}, "E204"),
        ({"MAINTENANCE_INTERVAL": 1e13}, "E205"),
        ({"WORKER_EXPIRY": float("inf")}, "E205"),
        ({"SCHEDULES": {"s": {"every": 10**13, "job": "tests.noop"}}}, "E201"),
    ],
)
def test_checks_refuse_settings_out_of_range(jobs_settings, check_id):
    assert f"django_jobs.{check_id}" in _check_ids(**jobs_settings)


def test_checks_accept_the_limits_themselves():
    top = limits.MAX_SECONDS
    assert (
        _check_ids(
            LEASE=top,
            HEARTBEAT=top - 1,
            GRACE=0,
            POLL_INTERVAL=top,
            TIMEOUT=top,
            CONCURRENCY=limits.MAX_CONCURRENCY,
            BATCH=limits.MAX_INT,
            MAX_ATTEMPTS=limits.MAX_INT,
            BACKOFF={"kind": "exponential", "base": top, "ceiling": top, "jitter": 0.5},
            KEEP_MARKERS=top,
            KEEP_DEAD_LETTERS="520w",
            PRUNE_BATCH=limits.MAX_INT,
            MAINTENANCE_INTERVAL=1,
            WORKER_EXPIRY=top,
            CHANNEL="c" * 63,
        )
        == set()
    )


def test_check_messages_name_the_range_and_the_value():
    with override_settings(DJANGO_JOBS={"LEASE": 1e13}):
        (message,) = [m for m in run_checks() if m.id == "django_jobs.E005"]
    assert "DJANGO_JOBS['LEASE']" in message.msg
    assert "315360000 (ten years)" in message.msg
    assert "10000000000000.0" in message.msg


# ---- the smaller APIs -------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [1e13, 10**400, float("inf"), float("nan"), -1])
def test_snooze_and_extend_lease_refuse_durations_out_of_range(seconds):
    with pytest.raises(ValueError, match="Snooze"):
        Snooze(seconds)
    extended = []
    ctx = JobContext(
        id=uuid.uuid4(),
        name="n",
        queue="q",
        attempt=1,
        max_attempts=1,
        enqueued_at=timezone.now(),
        _extend=extended.append,
    )
    with pytest.raises(ValueError, match="extend_lease"):
        ctx.extend_lease(seconds)
    assert extended == []


@pytest.mark.parametrize("delay", [1e13, 10**400, float("nan"), -1])
def test_replay_refuses_a_delay_out_of_range(delay):
    DeadLetterFactory()
    with pytest.raises(ValueError, match="delay"):
        control.replay(DeadLetter.objects.all(), delay=delay)
    assert DeadLetter.objects.pending().count() == 1


# ---- the checks themselves, driven with any value ---------------------------------------------

ANY_VALUE = (
    st.integers()
    | st.integers(min_value=-(10**500), max_value=10**500)
    | st.floats()
    | st.booleans()
    | st.none()
    | st.text(max_size=5)
    | st.timedeltas().map(lambda d: d.total_seconds())
)


@settings(max_examples=500, deadline=None)
@given(value=ANY_VALUE, zero=st.booleans(), low=st.integers(-5, 5), span=st.integers(0, 2**40))
def test_limits_return_a_value_in_range_or_raise_the_given_error(value, zero, low, span):
    try:
        seconds = limits.seconds("x", value, zero=zero, error=JobsError)
    except JobsError as exc:
        assert str(exc).startswith("x must be")
    else:
        assert type(seconds) is float and math.isfinite(seconds)
        assert (0 <= seconds if zero else 0 < seconds) and seconds <= limits.MAX_SECONDS
        assert timezone.now() + timedelta(seconds=seconds)  # a date Python can hold
    try:
        number = limits.integer("n", value, low, low + span, error=JobsError)
    except JobsError as exc:
        assert str(exc).startswith("n must be") and len(str(exc)) < 200
    else:
        assert number is value and low <= number <= low + span


def test_transaction_survives_a_refused_enqueue_on_postgres_too():
    # A raw DataError from the database would abort it: nothing may reach the database.
    with transaction.atomic():
        for options in ({"max_attempts": HUGE_INT}, {"delay": 10**400}):
            with pytest.raises(InvalidJob):
                enqueue(jobs.noop, **options)
        enqueue(jobs.noop)
    assert Job.objects.count() == 1
    assert connection.vendor in ("postgresql", "sqlite", "mysql")
