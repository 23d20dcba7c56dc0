"""Rate limits of other units during a rolling deploy (issue 22, point 4; docs/flow-control.md).

Workers that count one group's starts in windows of different lengths ("5/s" and
"10/m") each hold the fleet to their own limit: a claim counts, in its own window,
every start of the fleet, whichever worker's limit it was claimed under.
"""

from __future__ import annotations

import signal
from datetime import datetime

import pytest

from django_jobs import enqueue_many, flow
from django_jobs.models import CompletionMarker, FlowWindow, WorkerBeat
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore
from tests.conftest import wait_for
from tests.testapp import flow_jobs

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
RATED = "tests.flow.rated"
FLOW_ENV = {"JOBS_TEST_FLOW": "1", "JOBS_CONN_MAX_AGE": "60"}


@pytest.fixture
def handlers():
    registered = flow_jobs.register()
    yield registered
    flow_jobs.unregister_all()


def _limit(rate: str) -> list[flow.Limit]:
    return [flow.Limit("name", RATED, None, flow.parse_rate(rate))]


def _over_limit(starts: list[tuple[datetime, flow.Rate]]) -> list[str]:
    """The starts whose claim saw more starts in its own window than its limit allows.

    `starts`: each start's time on the database clock (one claim's share one) and
    the limit of the worker that claimed it. The window of a start is its claimer's
    fixed window (flow.window_start); the starts counted are every start of the
    fleet in that window up to and including its own claim.
    """
    found = []
    for at, rate in starts:
        begin = flow.window_start(at, rate)
        seen = sum(1 for other, _ in starts if begin <= other <= at)
        if seen > rate.count:
            found.append(f"{at.isoformat()} under {rate}: {seen} starts in its window")
    return sorted(set(found))


def test_a_claim_counts_the_starts_claimed_under_a_limit_of_another_unit(handlers):
    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(60)])
    starts: list[tuple[datetime, flow.Rate]] = []
    # A worker at 10/m, one at 5/s, then the first again: each one's window counts the others'.
    for n, rate in enumerate(["10/m", "5/s", "10/m", "5/s", "10/m"]):
        [limit] = _limit(rate)
        got = JobStore().claim(
            ClaimRequest(
                queues=["default"], limit=100, token=f"w{n}#1", lease=60, flow_limits=[limit]
            )
        )
        starts += [(job.started_at, limit.rate) for job in got]
    assert starts, "nothing claimed"
    assert _over_limit(starts) == []
    # Within one minute window at most 10 + the 5/s worker's share: never the 25 of
    # counters that reset each other.
    assert len(starts) <= 10 + 5 * 2 * (1 + len({flow.window_start(a, r) for a, r in starts}))
    # Every window length has its counter, whichever limit claimed.
    keys = set(FlowWindow.objects.values_list("key", flat=True))
    assert {f"name:{RATED}@{seconds}" for seconds in flow.COUNTED_WINDOWS} <= keys


def test_the_counters_of_the_release_before_are_still_read_and_written(handlers):
    # A worker of the release before counts in the group's plain key, in its own
    # window: during the deploy that brings the counters per length, both count.
    from django_jobs.store import pgrun

    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(30)])
    [limit] = _limit("10/m")
    now = pgrun.run("default", "SELECT statement_timestamp()")[0][0]
    FlowWindow.objects.create(
        key=limit.key, partition="", window_start=flow.window_start(now, limit.rate), starts=7
    )
    got = JobStore().claim(
        ClaimRequest(queues=["default"], limit=100, token="w#1", lease=60, flow_limits=[limit])
    )
    if flow.window_start(got[0].started_at if got else now, limit.rate) != flow.window_start(
        now, limit.rate
    ):
        pytest.skip("the minute rolled over between the two statements")
    assert len(got) == 3
    assert FlowWindow.objects.get(key=limit.key).starts == 10


@pytest.mark.slow
def test_workers_at_5_per_second_and_10_per_minute_hold_each_ones_limit(handlers, worker_process):
    # A rolling deploy that changes the limit's unit: before the fix the two reset
    # one counter row each other's way, and 400 jobs started within about 2 s.
    total = 40
    enqueue_many(handlers["rated"], [{"label": str(i)} for i in range(total)])
    rates, procs = {}, []
    for rate in ("5/s", "10/m"):
        proc = worker_process(
            "--concurrency", "4", extra_env={**FLOW_ENV, "JOBS_TEST_FLOW_RATE": rate}
        )
        beat = wait_for(
            lambda proc=proc: WorkerBeat.objects.filter(pid=proc.pid).first(),
            message=f"the {rate} worker's heartbeat row",
        )
        rates[beat.id] = flow.parse_rate(rate)
        procs.append(proc)
    wait_for(lambda: CompletionMarker.objects.count() == total, timeout=90, message="all done")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait() for proc in procs] == [0, 0]
    # The database's record of each start: its claim's time, and the worker that claimed it.
    starts = [
        (started_at, rates[worker])
        for started_at, worker in CompletionMarker.objects.values_list("started_at", "worker_id")
    ]
    assert len(starts) == total
    assert _over_limit(starts) == []
    by_worker = {str(rate): sum(1 for _, r in starts if r == rate) for rate in rates.values()}
    print(f"5/s and 10/m over {total} jobs: {by_worker}")
    # At 5/s at most, and the 10/m worker at most 10 a minute: never all at once.
    span = (max(at for at, _ in starts) - min(at for at, _ in starts)).total_seconds()
    assert span >= (total - 2 * 10) / 5 - 1, span
