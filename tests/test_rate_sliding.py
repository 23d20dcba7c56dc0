"""Sliding rate windows (issue 27, point 3; docs/flow-control.md).

`rate_window="sliding"`: no interval of the window's length, ends included, ever
holds more than N starts, across workers. A fixed window holds at most N, but 2N
can start within one window's length, across its boundary.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_jobs import enqueue, enqueue_many, flow, job
from django_jobs.exceptions import InvalidJob
from django_jobs.fleet import WorkerBeat
from django_jobs.models import CompletionMarker, FlowStart, FlowWindow
from django_jobs.registry import unregister
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore
from tests.conftest import wait_for
from tests.testapp import flow_jobs

RATED = "tests.flow.rated"
FLOW_ENV = {"JOBS_TEST_FLOW": "1", "JOBS_CONN_MAX_AGE": "60"}


@pytest.fixture
def handlers():
    registered = flow_jobs.register()
    yield registered
    flow_jobs.unregister_all()


def _crowded(starts: list[datetime], rate: flow.Rate) -> list[str]:
    """Every interval of the window's length, ends included, that holds more than N starts.

    The most crowded intervals begin at a start: one per start, counted to its end.
    """
    starts = sorted(starts)
    window = timedelta(seconds=rate.seconds)
    found = []
    for i, begin in enumerate(starts):
        inside = sum(1 for at in starts[i:] if at <= begin + window)
        if inside > rate.count:
            found.append(f"{inside} starts in [{begin.isoformat()}, +{rate.seconds}s]")
    return found


def _claim(limit: flow.Limit, token: str, n: int = 100) -> list[datetime]:
    got = JobStore().claim(
        ClaimRequest(queues=["default"], limit=n, token=token, lease=60, flow_limits=[limit])
    )
    return [job.started_at for job in got]


def _wait_until_fraction(fraction: float) -> None:
    """Sleep until the database clock is `fraction` into a second."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        [(now,)] = cursor.fetchall()
    time.sleep((fraction - float(now) % 1) % 1)


# ---- declaration: any database ----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "5/s", "rate_window": "rolling"},
        {"rate_limit": "5/s", "rate_window": "Sliding"},
        {"rate_limit": "5/s", "rate_window": ""},
        {"rate_limit": "5/s", "rate_window": True},
        {"rate_limit": "5/s", "rate_window": 60},
        {"rate_window": "sliding"},  # nothing to count
        {"rate_window": "fixed"},
        {"global_concurrency": 2, "rate_window": "sliding"},
    ],
)
def test_bad_windows_are_refused_at_declaration(options):
    with pytest.raises(InvalidJob, match="rate_window"):
        job(name="tests.sliding.invalid", **options)(lambda payload, ctx: None)


def test_the_window_is_fixed_unless_it_slides():
    try:
        fixed = job(name="tests.sliding.a", rate_limit="5/s")(lambda payload, ctx: None)
        named = job(name="tests.sliding.b", rate_limit="5/s", rate_window="fixed")(
            lambda payload, ctx: None
        )
        slides = job(name="tests.sliding.c", rate_limit="100/m", rate_window="sliding")(
            lambda payload, ctx: None
        )
    finally:
        for name in ("tests.sliding.a", "tests.sliding.b", "tests.sliding.c"):
            unregister(name)
    assert fixed.rate_limit == named.rate_limit == flow.Rate(5, 1)
    assert slides.rate_limit == flow.Rate(100, 60, sliding=True)
    assert str(slides.rate_limit) == "100/m"
    [limit] = flow.handler_limits([slides])
    assert limit.sliding and not flow.handler_limits([fixed])[0].sliding


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "10/s", "rate_window": "rolling"},
        {"rate_limit": "10/s", "rate_window": 1},
        {"rate_window": "sliding"},
        {"global_concurrency": 2, "rate_window": "sliding"},
    ],
)
def test_bad_queue_windows_are_check_errors(settings, options):
    from django_jobs.checks import check_settings

    settings.DJANGO_JOBS = {"QUEUES": {"emails": options}}
    errors = [e for e in check_settings() if e.id == "django_jobs.E301"]
    assert errors and "rate_window" in errors[0].msg


def test_queue_windows_parse(settings):
    from django_jobs import conf
    from django_jobs.checks import check_settings

    settings.DJANGO_JOBS = {
        "QUEUES": {
            "emails": {"rate_limit": "10/s", "rate_window": "sliding"},
            "sms": {"rate_limit": "10/s", "rate_window": "fixed"},
        }
    }
    assert flow.queue_limits(conf.get("QUEUES")) == {
        "emails": (None, flow.Rate(10, 1, sliding=True)),
        "sms": (None, flow.Rate(10, 1)),
    }
    assert "django_jobs.E301" not in [e.id for e in check_settings()]


# ---- the claim: PostgreSQL ------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_a_boundary_lets_a_fixed_window_start_2n_and_a_sliding_one_n(handlers, settings, claim):
    # N claimed late in a second, then N early in the next: the fixed window's
    # counter resets at the boundary, the sliding one still counts the first N.
    settings.DJANGO_JOBS = {"CLAIM": claim}
    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(40)])
    seen = {}
    for n, sliding in enumerate((False, True)):
        limit = flow.Limit("name", RATED, None, flow.Rate(5, 1, sliding=sliding))
        _wait_until_fraction(0.8)
        starts = _claim(limit, f"w{n}#1") + _claim(limit, f"w{n}#2")
        _wait_until_fraction(0.05)
        starts += _claim(limit, f"w{n}#3") + _claim(limit, f"w{n}#4")
        seen[sliding] = starts
    assert len(seen[False]) == 10, seen[False]  # 5 each side of the boundary
    assert _crowded(seen[False], flow.Rate(5, 1)), "the fixed window held 2N in a second"
    assert len(seen[True]) == 5, seen[True]
    assert _crowded(seen[True], flow.Rate(5, 1)) == []
    # Its log: one row per claim that started jobs, at the jobs' started_at.
    rows = list(FlowStart.objects.values_list("key", "partition", "started_at", "starts"))
    assert rows == [(f"name:{RATED}", "", min(seen[True]), 5)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_full_sliding_window_admits_again_as_its_oldest_starts_age_out(handlers):
    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(20)])
    limit = flow.Limit("name", RATED, None, flow.Rate(3, 1, sliding=True))
    starts = _claim(limit, "w#1", n=2)
    time.sleep(0.5)
    starts += _claim(limit, "w#2")  # the third
    assert len(starts) == 3
    assert _claim(limit, "w#3") == []  # full until the first two are a second old
    wait_for(lambda: starts.extend(_claim(limit, "w#4")) or len(starts) > 3, timeout=3)
    assert len(starts) == 5  # the first two's slots, not the third's
    assert starts[3] - starts[0] >= timedelta(seconds=1)
    assert _crowded(starts, flow.Rate(3, 1)) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_log_is_counted_per_partition_and_pruned_by_the_claims():
    name = "tests.sliding.partitioned"
    handler = job(name=name, rate_limit="2/m", rate_window="sliding", partition_by="customer")(
        lambda payload, ctx: None
    )
    try:
        for customer in ("a", "b"):
            enqueue_many(handler, [{"customer": customer, "i": i} for i in range(5)])
        [limit] = flow.handler_limits([handler])
        now = timezone.now()
        FlowStart.objects.bulk_create(
            [
                # An hour and more ago: no window reads it; the claim deletes it.
                FlowStart(
                    key=limit.key, partition="a", started_at=now - timedelta(hours=2), starts=9
                ),
                # 30 s ago: a's window holds one start already.
                FlowStart(
                    key=limit.key, partition="a", started_at=now - timedelta(seconds=30), starts=1
                ),
            ]
        )
        got = JobStore().claim(
            ClaimRequest(queues=["default"], limit=100, token="w#1", lease=60, flow_limits=[limit])
        )
        assert sorted(json.loads(j.payload)["customer"] for j in got) == ["a", "b", "b"]
        log = sorted(FlowStart.objects.values_list("partition", "starts"))
        assert log == [("a", 1), ("a", 1), ("b", 2)]  # the 2-hour-old row is gone
        assert _claim(limit, "w#2") == []
        # The fixed counters still count its starts (for fixed-window workers, `jobs status`).
        assert FlowWindow.objects.filter(key=limit.counter(60)).count() == 2
    finally:
        unregister(name)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_queue_with_a_sliding_window(settings):
    name = "tests.sliding.mail"
    handler = job(name=name, queue="emails")(lambda payload, ctx: None)
    settings.DJANGO_JOBS = {"QUEUES": {"emails": {"rate_limit": "4/s", "rate_window": "sliding"}}}
    try:
        enqueue_many(handler, [{"i": i} for i in range(10)])
        limit = flow.Limit("queue", "emails", None, flow.Rate(4, 1, sliding=True))
        request = ClaimRequest(
            queues=["emails"], limit=3, token="w#1", lease=60, flow_limits=[limit]
        )
        first = JobStore().claim(request)
        second = JobStore().claim(request._replace(token="w#2"))
        assert (len(first), len(second)) == (3, 1)  # 4 per rolling second, whatever the boundary
        assert FlowStart.objects.filter(key="queue:emails").count() == 2
    finally:
        unregister(name)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_jobs_status_counts_the_sliding_window():
    from django_jobs.status import flow_status

    name = "tests.sliding.status"
    handler = job(name=name, rate_limit="5/m", rate_window="sliding")(lambda payload, ctx: None)
    try:
        enqueue(handler, {"label": "x"})
        [limit] = flow.handler_limits([handler])
        assert len(_claim(limit, "w#1")) == 1
        FlowStart.objects.create(
            key=limit.key, partition="", started_at=timezone.now() - timedelta(seconds=40), starts=3
        )
        [status] = [s for s in flow_status() if s.value == name]
        assert status.starts == 4  # the claim's 1 and the 3 logged 40 s ago
        assert status.rate_limit == "5/m sliding"
    finally:
        unregister(name)


# ---- real workers ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_three_workers_never_start_more_than_n_in_any_sliding_second(
    handlers, worker_process, claim
):
    total, rate = 60, flow.Rate(10, 1, sliding=True)
    env = {
        **FLOW_ENV,
        "JOBS_TEST_FLOW_RATE": "10/s",
        "JOBS_TEST_FLOW_WINDOW": "sliding",
        "JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim}),
    }
    procs = [worker_process("--concurrency", "4", extra_env=env) for _ in range(3)]
    # All three up before the jobs exist: on a loaded machine a worker that starts
    # seconds late would find the 6 s of work done without it (seen once).
    wait_for(lambda: WorkerBeat.objects.count() == 3, timeout=60, message="three workers up")
    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(total)])
    wait_for(lambda: CompletionMarker.objects.count() == total, timeout=90, message="all done")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait() for proc in procs] == [0, 0, 0]
    # The database's record of each start: its claim's time on the database clock.
    starts = list(CompletionMarker.objects.values_list("started_at", flat=True))
    workers = set(CompletionMarker.objects.values_list("worker_id", flat=True))
    assert len(starts) == total
    assert len(workers) == 3, workers  # all three claimed: the lock, not luck, held them
    assert _crowded(starts, rate) == []
    # And they kept up: 60 jobs at 10 per rolling second take 5 s and some, not 20.
    span = (max(starts) - min(starts)).total_seconds()
    assert 5 <= span < 15, span
