"""drain() with flow limits declared (issue 22, point 2): it runs until nothing is due.

Limits are enforced on PostgreSQL only, so these tests run there. A limit on any
handler of the project, even one the test never enqueues, puts the worker on its
limited claim; drain() must still run every due job, and wait for a limit that
holds due jobs back (a rate window) instead of returning with them left.
"""

from __future__ import annotations

import time

import pytest

from django_jobs import enqueue, job, workflow
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import unregister
from django_jobs.testing import DrainError, drain
from tests.testapp import flow_jobs
from tests.testapp import jobs as handlers
from tests.testapp.models import Audit

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

RATED = "tests.drain.rated"


def _rated(payload, ctx):
    Audit.objects.create(label=f"rated|{payload['n']}", job_id=ctx.id)


@pytest.fixture
def limits_elsewhere():
    """Flow limits on handlers these tests never enqueue (tests/testapp/flow_jobs.py)."""
    registered = flow_jobs.register()
    yield registered
    flow_jobs.unregister_all()


@pytest.fixture
def rated(limits_elsewhere):
    handler = job(name=RATED, rate_limit="5/s")(_rated)
    yield handler
    unregister(RATED)


def test_an_always_failing_job_runs_all_its_attempts(limits_elsewhere):
    enqueue(handlers.flaky, {})  # max_attempts=3, never succeeds
    summary = drain(run_scheduled=True)
    assert (len(summary.retried), len(summary.dead)) == (2, 1), str(summary)
    assert [a.attempt for a in summary.attempts] == [1, 2, 3]
    assert Job.objects.count() == 0
    assert DeadLetter.objects.get().attempts == 3


def test_a_two_step_workflow_runs_both_steps(limits_elsewhere):
    first = enqueue(handlers.record, {"label": "first"})
    enqueue(handlers.record, {"label": "second"}, after=[first])
    summary = drain()
    assert [a.payload["label"] for a in summary.succeeded] == ["first", "second"], str(summary)
    assert Job.objects.count() == 0


def test_a_diamond_runs_all_four_steps(limits_elsewhere):
    with workflow(name="diamond") as w:
        top = w.enqueue(handlers.record, {"label": "top"})
        left = w.enqueue(handlers.record, {"label": "left"}, after=[top])
        right = w.enqueue(handlers.record, {"label": "right"}, after=[top])
        w.enqueue(handlers.record, {"label": "bottom"}, after=[left, right])
    summary = drain()
    labels = [a.payload["label"] for a in summary.succeeded]
    assert labels[0] == "top" and labels[-1] == "bottom" and len(labels) == 4, str(summary)
    assert Job.objects.count() == 0
    assert CompletionMarker.objects.count() == 4


def test_jobs_of_a_concurrency_capped_handler_all_run(limits_elsewhere):
    for i in range(7):
        enqueue(limits_elsewhere["capped"], {"seconds": 0, "label": str(i)})  # at most 2 at once
    enqueue(handlers.record, {"label": "free"})
    summary = drain()
    assert len(summary.succeeded) == 8, str(summary)
    assert Job.objects.count() == 0


def test_rate_limited_jobs_all_run_window_by_window(rated):
    for n in range(12):
        enqueue(rated, {"n": n})
    enqueue(handlers.record, {"label": "free"})
    started = time.monotonic()
    summary = drain()
    elapsed = time.monotonic() - started
    assert len(summary.succeeded) == 13, str(summary)
    assert Job.objects.count() == 0
    # 5 starts per one-second window: the twelfth needs the third window.
    assert 1.0 < elapsed < 10, elapsed
    starts = sorted(
        CompletionMarker.objects.filter(name=RATED).values_list("started_at", flat=True)
    )
    per_second: dict[int, int] = {}
    for at in starts:
        per_second[int(at.timestamp())] = per_second.get(int(at.timestamp()), 0) + 1
    assert max(per_second.values()) <= 5, per_second


def test_jobs_a_limit_holds_back_past_max_rounds_raise_drain_error(limits_elsewhere):
    hourly = job(name="tests.drain.hourly", rate_limit="1/h")(_rated)
    try:
        enqueue(hourly, {"n": 1})
        enqueue(hourly, {"n": 2})
        with pytest.raises(DrainError, match=r"tests\.drain\.hourly x1\. 3 of them") as caught:
            drain(max_rounds=4)
    finally:
        unregister("tests.drain.hourly")
    assert len(caught.value.drained.succeeded) == 1
    assert Job.objects.filter(name="tests.drain.hourly").count() == 1
