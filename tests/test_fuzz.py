"""Property-based tests: whatever enqueue is given, it either round-trips the payload
exactly or raises the library's own error and writes nothing; whatever a row holds,
the worker dead-letters it or runs it, and never crashes."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_jobs import JobsError, enqueue, enqueue_many
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.worker import Worker

pytestmark = [pytest.mark.chaos]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SAFE_HANDLERS = [
    "tests.noop",
    "tests.record",
    "tests.validated",
    "tests.fatal",
    "tests.flaky",
    "tests.bad_return",
]

# Any unicode, lone surrogates included (they must be refused, not stored broken).
any_text = st.text(st.characters(codec=None), max_size=40) | st.text(
    st.characters(categories=["Cs", "Cc", "Zs"]), max_size=5
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
payloads = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(any_text | st.integers(-3, 3), children, max_size=4)
    ),
    max_leaves=12,
)
names = st.sampled_from(SAFE_HANDLERS) | any_text
keys = st.none() | any_text | st.integers()
delays = (
    st.none()
    | st.floats(allow_nan=True)
    | st.integers(-5, 10**12)
    | st.timedeltas(max_value=dt.timedelta(days=3650))
)
run_ats = st.none() | st.datetimes(timezones=st.timezones() | st.none())
priorities = st.none() | st.integers(-200, 200) | st.floats() | st.booleans() | st.text(max_size=3)
queues = st.none() | st.sampled_from(["default", "emails"]) | any_text


def _counts():
    return (Job.objects.count(), CompletionMarker.objects.count(), DeadLetter.objects.count())


def _json_equal(a, b) -> bool:
    """Equality that also holds for -0.0 vs 0.0 and keeps int/float apart."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.django_db
@FUZZ
@given(
    name=st.sampled_from(SAFE_HANDLERS),
    payload=payloads,
    key=st.none() | any_text,
    delay=st.none() | st.floats(0, 10**6),
    priority=st.none() | st.integers(-100, 100),
)
def test_valid_options_round_trip_any_payload_exactly(name, payload, key, delay, priority):
    before = _counts()
    try:
        result = enqueue(name, payload, key=key, delay=delay, priority=priority)
    except JobsError as exc:
        event(f"refused: {type(exc).__name__}")
        assert _counts() == before
        return
    event("accepted")
    row = Job.objects.get(id=result.id)
    assert _json_equal(json.loads(row.payload), payload)
    assert (row.key, row.priority) == (key, priority or 0)
    row.delete()


@pytest.mark.django_db
@FUZZ
@given(
    name=names,
    payload=payloads,
    key=keys,
    delay=delays,
    run_at=run_ats,
    priority=priorities,
    queue=queues,
)
def test_enqueue_round_trips_or_raises_its_own_error_and_writes_nothing(
    name, payload, key, delay, run_at, priority, queue
):
    before = _counts()
    try:
        result = enqueue(
            name, payload, key=key, delay=delay, run_at=run_at, priority=priority, queue=queue
        )
    except JobsError as exc:
        event(f"refused: {type(exc).__name__}")
        assert _counts() == before
        return
    event("accepted")
    row = Job.objects.get(id=result.id)
    assert _json_equal(json.loads(row.payload), payload)
    assert row.name == name
    assert _counts() == (before[0] + 1, before[1], before[2])
    row.delete()


@pytest.mark.django_db
@FUZZ
@given(
    items=st.lists(payloads, min_size=1, max_size=5),
    keys_=st.none() | st.lists(keys, min_size=1, max_size=5),
)
def test_enqueue_many_is_all_or_nothing(items, keys_):
    before = _counts()
    try:
        results = enqueue_many("tests.noop", items, keys=keys_)
    except JobsError:
        assert _counts() == before
        return
    assert len(results) == len(items)
    new = [r for r in results if not r.duplicate]
    for result, payload in zip(results, items, strict=True):
        if not result.duplicate:
            assert _json_equal(json.loads(Job.objects.get(id=result.id).payload), payload)
    Job.objects.filter(id__in=[r.id for r in new]).delete()


rows = st.fixed_dictionaries(
    {
        "name": st.sampled_from(SAFE_HANDLERS)
        | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60),
        "payload": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60)
        | payloads.map(lambda p: json.dumps(p, allow_nan=True)),
        "priority": st.integers(-100, 100),
        "attempts": st.integers(0, 12),
        "max_attempts": st.integers(1, 6),
        "key": st.none()
        | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30),
    }
)


@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(rows, min_size=1, max_size=6, unique_by=lambda r: r["key"] or id(r)))
def test_fuzzed_rows_are_dead_lettered_or_run_and_never_crash_the_worker(batch):
    for model in (Job, CompletionMarker, DeadLetter):  # a failed example may have left rows
        model.objects.all().delete()
    past = timezone.now() - dt.timedelta(minutes=1)
    with connection.cursor() as cursor:
        for row in batch:
            cursor.execute(
                "INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, "
                f"enqueued_at, attempts, max_attempts, {connection.ops.quote_name('key')}, errors) "
                "VALUES (%s, %s, 'default', %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    Job._meta.pk.get_db_prep_value(uuid.uuid4(), connection),
                    row["name"],
                    row["payload"],
                    row["priority"],
                    past,
                    past,
                    row["attempts"],
                    row["max_attempts"],
                    row["key"],
                    "[]",
                ],
            )
    # Rows naming no handler wait for UNKNOWN_NAME_GRACE: here none, so they end too.
    with override_settings(DJANGO_JOBS={**django_settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": 0}):
        worker = Worker(burst=True, concurrency=2, queues=["default"])
        worker.run()
    assert Job.objects.count() == 0  # every row ended somewhere
    assert CompletionMarker.objects.count() + DeadLetter.objects.count() == len(batch)
    Job.objects.all().delete()
    CompletionMarker.objects.all().delete()
    DeadLetter.objects.all().delete()
