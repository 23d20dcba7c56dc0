"""Chunk handlers: @job(chunk=N) called with up to N payloads (docs/handlers.md#chunk-handlers)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from django_jobs import ChunkContext, ChunkFailed, enqueue_many, job
from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import unregister
from django_jobs.testing import drain
from django_jobs.worker import Worker
from tests.conftest import POSTGRES
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
    for name in ("sum", "slow", "fails", "partial", "by_index", "short", "atomic", "atomic_fails"):
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

    def stop_once_buffered():
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if Job.objects.filter(locked_by__isnull=False).count() == 2:
                    break
                time.sleep(0.05)
        finally:
            connection.close()
            worker.stop()

    stopper = threading.Thread(target=stop_once_buffered)
    stopper.start()
    started = time.monotonic()
    try:
        worker.run()
    finally:
        stopper.join()
    assert time.monotonic() - started < 30
    assert calls == []  # the chunk never ran
    assert Job.objects.count() == 2
    assert set(Job.objects.values_list("attempts", flat=True)) == {0}
    assert not Job.objects.filter(locked_by__isnull=False).exists()
