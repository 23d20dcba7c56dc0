"""Chunk handlers: @job(chunk=N) called with up to N payloads (docs/handlers.md#chunk-handlers)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from django_jobs import ChunkContext, ChunkFailed, control, enqueue_many, job
from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.registry import unregister
from django_jobs.testing import drain
from django_jobs.worker import Worker
from tests.conftest import POSTGRES, wait_for
from tests.factories import JobFactory
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)
FAST_RETRY = {"BACKOFF": {"kind": "fixed", "base": 0, "ceiling": 0, "jitter": 0}}
calls: list[list[int]] = []


@pytest.fixture(autouse=True, params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, **FAST_RETRY, "CLAIM": request.param}
    calls.clear()
    return request.param


@pytest.fixture(autouse=True, scope="module")
def _unregister_handlers():
    yield
    for name in (
        *("sum", "slow", "fails", "partial", "by_index", "short", "atomic", "atomic_fails"),
        *("waits", "timed", "timed_out", "validated"),
    ):
        unregister(f"tests.chunks.{name}")


@job(name="tests.chunks.sum", chunk=4, chunk_wait=0.2)
def chunk_sum(payloads, ctx):
    assert isinstance(ctx, ChunkContext) and len(ctx.jobs) == len(payloads)
    calls.append([p["n"] for p in payloads])
    return [p["n"] * 10 for p in payloads]


@job(name="tests.chunks.fails", chunk=3, chunk_wait=0.1, max_attempts=2)
def chunk_fails(payloads, ctx):
    calls.append([p["n"] for p in payloads])
    raise RuntimeError("the whole chunk broke")


@job(name="tests.chunks.partial", chunk=3, chunk_wait=0.1, max_attempts=2)
def chunk_partial(payloads, ctx):
    calls.append([p["n"] for p in payloads])
    failed = {
        c.id: ValueError(f"bad {p['n']}")
        for p, c in zip(payloads, ctx.jobs, strict=True)
        if p["n"] == 1
    }
    if failed:
        raise ChunkFailed(failed, results=[p["n"] for p in payloads])
    return [p["n"] for p in payloads]


@job(name="tests.chunks.by_index", chunk=3, chunk_wait=0.1, max_attempts=2)
def chunk_by_index(payloads, ctx):
    calls.append([p["n"] for p in payloads])
    failed = {i: ValueError("bad") for i, p in enumerate(payloads) if p["n"] == 2}
    if failed:
        raise ChunkFailed(failed)


@job(name="tests.chunks.short", chunk=3, chunk_wait=0.1, max_attempts=1)
def chunk_short(payloads, ctx):
    return [1]


@job(name="tests.chunks.atomic", chunk=3, chunk_wait=0.1, atomic=True)
def chunk_atomic(payloads, ctx):
    for p, c in zip(payloads, ctx.jobs, strict=True):
        Audit.objects.create(label=f"atomic-{p['n']}", job_id=c.id)


@job(name="tests.chunks.atomic_fails", chunk=3, chunk_wait=0.1, atomic=True, max_attempts=1)
def chunk_atomic_fails(payloads, ctx):
    for p, c in zip(payloads, ctx.jobs, strict=True):
        Audit.objects.create(label=f"atomic-{p['n']}", job_id=c.id)
    raise RuntimeError("roll it all back")


def _enqueue(handler, count):
    return enqueue_many(handler, [{"n": n} for n in range(count)])


@pytest.mark.parametrize(
    "options",
    [
        {"chunk": 1},
        {"chunk": 1001},
        {"chunk": True},
        {"chunk": 10, "chunk_wait": -1},
        {"chunk": 10, "chunk_wait": float("inf")},
        {"chunk_wait": 1.0},
        {"chunk": 10, "concurrency": 2},
    ],
)
def test_declaration_errors(options):
    with pytest.raises(InvalidJob):

        @job(name="tests.chunks.refused", **options)
        def refused(payloads, ctx):
            pass

    unregister("tests.chunks.refused")


def test_async_chunk_handler_is_refused():
    with pytest.raises(InvalidJob, match="async"):

        @job(name="tests.chunks.refused_async", chunk=10)
        async def refused(payloads, ctx):
            pass

    unregister("tests.chunks.refused_async")


def test_a_full_chunk_is_one_call_and_results_are_stored(run_worker):
    _enqueue(chunk_sum, 4)
    worker = run_worker(concurrency=1, batch=4)
    assert sorted(calls[0]) == [0, 1, 2, 3] and len(calls) == 1
    assert worker.stats.succeeded == 4
    assert Job.objects.count() == 0
    results = sorted(CompletionMarker.objects.values_list("result", flat=True))
    assert results == [0, 10, 20, 30]


def test_chunk_wait_flushes_a_partial_chunk_in_a_serving_worker():
    _enqueue(chunk_sum, 2)
    worker = Worker(max_jobs=2, concurrency=1, poll_interval=0.1)
    worker.run()
    assert sorted(n for call in calls for n in call) == [0, 1]
    assert worker.stats.succeeded == 2
    assert CompletionMarker.objects.count() == 2


def test_burst_flushes_a_partial_chunk(run_worker):
    _enqueue(chunk_sum, 6)
    worker = run_worker(concurrency=1)
    assert sorted(n for call in calls for n in call) == list(range(6))
    assert all(len(call) <= 4 for call in calls)
    assert worker.stats.succeeded == 6


def test_whole_chunk_exception_retries_every_job_then_dead_letters_each(run_worker):
    _enqueue(chunk_fails, 3)
    run_worker(concurrency=1)
    assert sum(len(call) for call in calls) == 6  # two attempts of three jobs
    assert Job.objects.count() == 0
    dead = list(DeadLetter.objects.all())
    assert len(dead) == 3
    assert all(d.attempts == 2 and "the whole chunk broke" in d.error for d in dead)
    assert CompletionMarker.objects.count() == 0


def test_chunk_failed_by_id_retries_only_the_named_job(run_worker):
    _enqueue(chunk_partial, 3)
    run_worker(concurrency=1)
    assert sorted(CompletionMarker.objects.values_list("result", flat=True)) == [0, 2]
    dead = DeadLetter.objects.get()
    assert dead.attempts == 2 and "bad 1" in dead.error
    assert sorted(len(call) for call in calls) == [1, 3]  # the retry runs the named job alone


def test_chunk_failed_by_index_retries_only_the_named_job(run_worker):
    _enqueue(chunk_by_index, 3)
    run_worker(concurrency=1)
    assert CompletionMarker.objects.count() == 2
    assert DeadLetter.objects.get().attempts == 2
    assert sorted(len(call) for call in calls) == [1, 3]


def test_a_wrong_length_return_fails_the_chunk_with_type_error(run_worker):
    _enqueue(chunk_short, 3)
    run_worker(concurrency=1)
    dead = list(DeadLetter.objects.all())
    assert len(dead) == 3 and all("TypeError" in d.error for d in dead)
    assert CompletionMarker.objects.count() == 0


def test_atomic_chunk_exception_leaves_no_effects_nor_markers(run_worker):
    _enqueue(chunk_atomic_fails, 3)
    run_worker(concurrency=1)
    assert Audit.objects.count() == 0
    assert CompletionMarker.objects.count() == 0
    assert DeadLetter.objects.count() == 3


def test_atomic_chunk_success_writes_every_marker_and_effect(run_worker):
    results = _enqueue(chunk_atomic, 3)
    run_worker(concurrency=1)
    ids = {r.id for r in results}
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == ids
    assert set(Audit.objects.values_list("job_id", flat=True)) == ids
    assert Job.objects.count() == 0


def test_drain_runs_chunk_jobs_without_waiting():
    _enqueue(chunk_sum, 6)
    drain()
    assert sorted(n for call in calls for n in call) == list(range(6))
    assert all(len(call) <= 4 for call in calls)
    assert CompletionMarker.objects.count() == 6


def test_the_documented_chunk_handler_runs_as_written():
    page = (Path(__file__).resolve().parent.parent / "docs" / "handlers.md").read_text()
    section = page.split("## Chunk handlers", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(code, namespace)  # noqa: S102 - the page's own example
    try:
        enqueue_many("docs.index_documents", [{"text": "abc"}, {"text": ""}, {"text": "de"}])
        drain()
    finally:
        unregister("docs.index_documents")
    assert sorted(CompletionMarker.objects.values_list("result", flat=True)) == [2, 3]
    dead = DeadLetter.objects.get()
    assert dead.attempts == 3 and "nothing to index" in dead.error


def test_chunk_failed_naming_no_job_fails_the_chunk(run_worker):
    @job(name="tests.chunks.stranger", chunk=2, chunk_wait=0.1, max_attempts=1)
    def stranger(payloads, ctx):
        raise ChunkFailed({"not-a-job": ValueError("who")})

    try:
        _enqueue(stranger, 2)
        run_worker(concurrency=1)
    finally:
        unregister("tests.chunks.stranger")
    dead = list(DeadLetter.objects.all())
    assert len(dead) == 2 and all("TypeError" in d.error for d in dead)


@job(name="tests.chunks.slow", chunk=4, chunk_wait=60)
def chunk_slow(payloads, ctx):
    calls.append([p["n"] for p in payloads])


def test_shutdown_gives_buffered_jobs_back_unstarted():
    _enqueue(chunk_slow, 2)
    worker = Worker(concurrency=1, grace=5, poll_interval=0.1)
    _serve(
        worker,
        lambda: wait_for(
            lambda: Job.objects.filter(locked_by__isnull=False).count() == 2,
            timeout=30,
            message="both jobs buffered",
        ),
        timeout=30,
    )
    assert calls == []  # the chunk never ran
    assert Job.objects.count() == 2
    assert set(Job.objects.values_list("attempts", flat=True)) == {0}
    assert not Job.objects.filter(locked_by__isnull=False).exists()


def _serve(worker, until, timeout=20.0):
    """Run worker (serving, not burst) on this thread until until() holds in another thread.

    until runs on a helper thread (its own connection), which stops the worker
    when it returns; whatever it raised is raised here once the worker stopped.
    """
    failed: list[BaseException] = []

    def watch():
        try:
            until()
        except BaseException as exc:  # noqa: BLE001 - raised again on the test's thread
            failed.append(exc)
        finally:
            connection.close()
            worker.stop()

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        worker.run()
    finally:
        watcher.join()
    if failed:
        raise failed[0]
    assert time.monotonic() - started < timeout


# ---- an operator's cancel of a buffered job ----------------------------------------------------


@job(name="tests.chunks.waits", chunk=4, chunk_wait=3)
def chunk_waits(payloads, ctx):
    calls.append([p["n"] for p in payloads])
    return [p["n"] for p in payloads]


def test_cancelling_a_buffered_job_dead_letters_it_and_runs_the_rest_of_its_chunk():
    results = _enqueue(chunk_waits, 3)
    cancelled, kept = results[1].id, [results[0].id, results[2].id]
    # heartbeat every 0.5 s, far within the 3 s the partial chunk waits for a fourth job
    worker = Worker(concurrency=1, lease=1.5, poll_interval=0.1, grace=5)

    def cancel_while_buffered():
        wait_for(
            lambda: Job.objects.filter(locked_by__isnull=False).count() == 3,
            message="the 3 jobs to be claimed into the buffer",
        )
        assert calls == []  # still buffered: the chunk waits for its fourth job
        outcome = control.cancel([cancelled], by="ops")
        assert (outcome.cancelled, outcome.requested) == (0, 1)
        wait_for(
            lambda: CompletionMarker.objects.count() == 2, message="the rest of the chunk to run"
        )

    _serve(worker, cancel_while_buffered)
    assert [sorted(call) for call in calls] == [[0, 2]]  # one call, without the cancelled one
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == set(kept)
    letter = DeadLetter.objects.get()
    assert (letter.id, letter.reason, letter.attempts) == (cancelled, DeadReason.CANCELLED, 0)
    assert "cancelled before it started" in letter.error
    assert not Job.objects.exists()
    assert worker.stats.succeeded == 2


def test_cancelling_every_buffered_job_empties_the_buffer_without_a_call():
    ids = [r.id for r in _enqueue(chunk_waits, 2)]
    worker = Worker(concurrency=1, lease=1.5, poll_interval=0.1, grace=5)

    def cancel_both():
        wait_for(
            lambda: Job.objects.filter(locked_by__isnull=False).count() == 2,
            message="the 2 jobs to be claimed into the buffer",
        )
        assert control.cancel(ids).requested == 2
        wait_for(lambda: DeadLetter.objects.count() == 2, message="both dead letters")
        # A job claimed now joins whatever the buffer kept, and runs in its chunk.
        enqueue_many(chunk_waits, [{"n": 9}])
        wait_for(CompletionMarker.objects.exists, message="the next job's chunk to run")

    _serve(worker, cancel_both)
    assert calls == [[9]]  # the cancelled jobs were never passed to the handler
    letters = DeadLetter.objects.all()
    assert {(d.id, d.reason, d.attempts) for d in letters} == {
        (i, DeadReason.CANCELLED, 0) for i in ids
    }
    assert not Job.objects.exists()


# ---- a chunk past its timeout --------------------------------------------------------------------

saw_cancelled: list[bool] = []
errors_before: list[list[str]] = []  # each retried job's recorded errors, read by its retry


def _until_cancelled(ctx, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not ctx.is_cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    saw_cancelled.append(ctx.is_cancelled)


@job(name="tests.chunks.timed", chunk=3, chunk_wait=0.1, timeout=0.3, max_attempts=2)
def chunk_timed(payloads, ctx):
    """Outlive the timeout on the first attempt (until ctx.is_cancelled), succeed on the next."""
    calls.append([p["n"] for p in payloads])
    if ctx.jobs[0].attempt == 1:
        _until_cancelled(ctx)
        return ["late"] * len(payloads)  # discarded: the attempt timed out
    rows = Job.objects.filter(id__in=[c.id for c in ctx.jobs]).values_list("errors", flat=True)
    errors_before.extend([f"{e['type']}: {e['message']}" for e in errors] for errors in rows)
    return [p["n"] for p in payloads]


@job(name="tests.chunks.timed_out", chunk=3, chunk_wait=0.1, timeout=0.3, max_attempts=1)
def chunk_timed_out(payloads, ctx):
    calls.append([p["n"] for p in payloads])
    _until_cancelled(ctx)


def test_a_chunk_past_its_timeout_fails_every_job_with_timeout_error_then_retries(run_worker):
    saw_cancelled.clear()
    errors_before.clear()
    results = _enqueue(chunk_timed, 3)
    worker = run_worker(concurrency=1, batch=3, grace=5)
    assert [sorted(call) for call in calls] == [[0, 1, 2], [0, 1, 2]]
    assert saw_cancelled == [True]  # the handler saw ctx.is_cancelled at the deadline
    markers = CompletionMarker.objects.filter(job_id__in=[r.id for r in results])
    assert sorted(markers.values_list("result", flat=True)) == [0, 1, 2]  # not "late"
    assert set(markers.values_list("attempts", flat=True)) == {2}
    timed_out = "builtins.TimeoutError: handler ran longer than its 0.3s timeout"
    assert errors_before == [[timed_out]] * 3  # every job of the chunk's first attempt
    assert (worker.stats.retried, worker.stats.succeeded) == (3, 3)
    assert not Job.objects.exists() and not DeadLetter.objects.exists()


def test_a_chunk_past_its_timeout_on_its_last_attempt_dead_letters_each_job_and_work_goes_on():
    saw_cancelled.clear()
    timed = {r.id for r in _enqueue(chunk_timed_out, 3)}
    worker = Worker(concurrency=1, batch=3, poll_interval=0.1, grace=5)
    later: list = []

    def then_enqueue_more():
        wait_for(lambda: DeadLetter.objects.count() == 3, message="the 3 dead letters")
        later.extend(r.id for r in _enqueue(chunk_sum, 4))
        wait_for(
            lambda: CompletionMarker.objects.count() == 4,
            message="the jobs enqueued after the timeout to run",
        )

    _serve(worker, then_enqueue_more)
    letters = DeadLetter.objects.all()
    assert {d.id for d in letters} == timed
    for letter in letters:
        assert (letter.reason, letter.attempts) == (DeadReason.ATTEMPTS_EXHAUSTED, 1)
        assert "TimeoutError" in letter.error and "0.3s timeout" in letter.error
    assert saw_cancelled == [True]
    # The same worker (its one thread back from the abandoned chunk) claimed and ran the rest.
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == set(later)
    assert sorted(n for call in calls[1:] for n in call) == [0, 1, 2, 3]
    assert worker.stats.succeeded == 4 and worker.stats.dead == 3
    assert not Job.objects.exists()


# ---- per-payload validation ------------------------------------------------------------------


def _even_only(payload):
    if payload["n"] % 2:
        raise ValueError(f"odd payload {payload['n']}")
    return {**payload, "checked": True}


@job(name="tests.chunks.validated", chunk=4, chunk_wait=0.1, validate=_even_only)
def chunk_validated(payloads, ctx):
    assert len(ctx.jobs) == len(payloads)
    calls.append([(p["n"], p.get("checked")) for p in payloads])
    return [p["n"] for p in payloads]


def test_a_payload_that_fails_validation_is_dead_lettered_alone_and_left_out_of_the_call(
    run_worker,
):
    # enqueue() runs the validator too: rows written as a deploy of a stricter validator finds them
    rows = [JobFactory(name="tests.chunks.validated", payload=f'{{"n": {n}}}') for n in range(4)]
    run_worker(concurrency=1, batch=4)
    assert len(calls) == 1
    assert sorted(calls[0]) == [(0, True), (2, True)]  # the validator's values, odd ones out
    assert sorted(CompletionMarker.objects.values_list("result", flat=True)) == [0, 2]
    letters = DeadLetter.objects.order_by("payload")
    assert [d.id for d in letters] == [rows[1].id, rows[3].id]
    for letter, n in zip(letters, (1, 3), strict=True):
        assert (letter.reason, letter.attempts) == (DeadReason.INVALID_PAYLOAD, 1)
        assert f"odd payload {n}" in letter.error
    assert not Job.objects.exists()
