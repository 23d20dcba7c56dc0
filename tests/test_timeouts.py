"""Handlers that outlive their timeout (issue 22): they keep their slots, and the worker its bounds.

A thread cannot be killed: an abandoned handler keeps its job leased, its thread
and its slots until it returns; when every thread is stuck the worker exits 3.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid

import pytest
from django.core.management import call_command

from django_jobs import enqueue
from django_jobs.fleet import WorkerBeat
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.worker import EXIT_STUCK
from tests.conftest import POSTGRES, wait_for
from tests.testapp import jobs, stuck_jobs
from tests.testapp.models import Audit

TIMEOUT = "builtins.TimeoutError"


@pytest.fixture
def handlers():
    registered = stuck_jobs.register(flow=POSTGRES)
    yield registered
    stuck_jobs.unregister_all()


def _intervals(label):
    """Return {(job id, attempt): [start, end]} as stuck_jobs.stuck recorded them."""
    found: dict[tuple[str, str], list] = {}
    for text, at in Audit.objects.filter(label__contains=f"|{label}|").values_list(
        "label", "created_at"
    ):
        kind, _label, job_id, attempt = text.split("|")
        found.setdefault((job_id, attempt), [None, None])[0 if kind == "start" else 1] = at
    return found


def _max_overlap(intervals):
    events = []
    for start, end in intervals:
        events += [(start, 1), (end, -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = peak = 0
    for _at, step in events:
        running += step
        peak = max(peak, running)
    return peak


class Sampler:
    """Sample a worker process's threads and PostgreSQL sessions until stopped."""

    def __init__(self, pid, application_name):
        self.pid, self.name = pid, application_name
        self.threads = self.sessions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from django.db import connections

        try:
            while not self._stop.is_set():
                try:
                    self.threads = max(self.threads, len(os.listdir(f"/proc/{self.pid}/task")))
                except FileNotFoundError:
                    return  # the process exited
                if POSTGRES:
                    with connections["default"].cursor() as cursor:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            [self.name],
                        )
                        self.sessions = max(self.sessions, cursor.fetchone()[0])
                time.sleep(0.02)
        finally:
            connections.close_all()

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self


def _sampled(worker_process, *args, extra_env=None):
    name = f"jobs-h4-{uuid.uuid4().hex[:8]}"
    env = {"JOBS_TEST_STUCK": "flow" if POSTGRES else "1", "PGAPPNAME": name, **(extra_env or {})}
    worker = worker_process(*args, extra_env=env)
    return worker, Sampler(worker.pid, name)


pytestmark = [pytest.mark.django_db(transaction=True)]


# ---- real worker processes ---------------------------------------------------------


@pytest.mark.slow
def test_a_capped_handler_past_its_timeout_keeps_its_slot_its_thread_and_connection(
    handlers, worker_process
):
    """`@job(concurrency=1)`, a 0.3 s timeout, 1 s handlers: one at a time, no extra thread."""
    ids = [enqueue(handlers["capped"], {"seconds": 1.0, "label": "capped"}).id for _ in range(4)]
    others = [enqueue(jobs.record, {"label": f"other-{i}"}).id for i in range(20)]
    worker, sampler = _sampled(worker_process, "--concurrency", "2", "--lease", "5")
    wait_for(
        lambda: DeadLetter.objects.filter(id__in=ids).count() == 4,
        timeout=60,
        message="the capped jobs' dead letters",
    )
    sampler.stop()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    intervals = _intervals("capped")
    assert len(intervals) == 4 and all(end for _, end in intervals.values())
    assert _max_overlap(intervals.values()) == 1
    for letter in DeadLetter.objects.filter(id__in=ids):
        assert (letter.reason, [e["type"] for e in letter.errors]) == (
            DeadReason.ATTEMPTS_EXHAUSTED,
            [TIMEOUT],
        )
    assert CompletionMarker.objects.filter(job_id__in=ids).count() == 0  # late returns discarded
    assert CompletionMarker.objects.filter(job_id__in=others).count() == 20
    # The dispatcher, two executors and (on PostgreSQL) the listener: nothing replaces a
    # stuck executor, so neither threads nor connections pass concurrency + 2.
    assert sampler.threads <= 2 + 2, sampler.threads
    if POSTGRES:
        assert 1 <= sampler.sessions <= 2 + 2, sampler.sessions
    log = worker.output()
    assert "its abandoned handler returned after" in log
    # Capped jobs claimed behind a stuck one were given back (attempt not counted) for others.
    assert re.search(r"stopped: .* \d+ released", log), log[-2000:]


@pytest.mark.postgres
@pytest.mark.slow
def test_global_concurrency_counts_a_timed_out_handler_until_it_returns(handlers, worker_process):
    """`global_concurrency=1`, a 0.3 s timeout, 1.5 s handlers, two workers: one at a time."""
    ids = [enqueue(handlers["flow"], {"seconds": 1.5, "label": "flow"}).id for _ in range(3)]
    started = [_sampled(worker_process, "--concurrency", "2") for _ in range(2)]
    wait_for(
        lambda: DeadLetter.objects.filter(id__in=ids).count() == 3,
        timeout=60,
        message="the limited jobs' dead letters",
    )
    for worker, sampler in started:
        sampler.stop()
        worker.signal(signal.SIGTERM)
    assert [w.wait(timeout=30) for w, _ in started] == [0, 0]
    intervals = _intervals("flow")
    assert len(intervals) == 3 and all(end for _, end in intervals.values())
    assert _max_overlap(intervals.values()) == 1
    assert [[e["type"] for e in letter.errors] for letter in DeadLetter.objects.all()] == [
        [TIMEOUT]
    ] * 3
    for _worker, sampler in started:
        assert sampler.threads <= 2 + 2 and sampler.sessions <= 2 + 2


@pytest.mark.slow
def test_a_worker_whose_threads_are_all_stuck_stops_claiming_and_exits_3(handlers, worker_process):
    stuck = [enqueue(handlers["plain"], {"seconds": 600, "label": "plain"}).id for _ in range(2)]
    later = enqueue(jobs.record, {"label": "after-the-stuck-ones"})
    worker, sampler = _sampled(worker_process, "--concurrency", "2", "--grace", "1")
    code = worker.wait(timeout=30)
    sampler.stop()
    log = worker.output()
    assert code == EXIT_STUCK == 3, log[-3000:]
    assert "the worker exits unless one returns within 1s" in log
    assert "all 2 handler thread(s) are stuck in handlers past their timeout and the 1s" in log
    assert log.count("tests.stuck.plain[") >= 2  # the error names the stuck handlers
    assert "CommandError:" in log and "exiting for a restart" in log
    # Each stuck attempt is recorded as timed out, its retry due; nothing else ran.
    for row in Job.objects.filter(id__in=stuck):
        assert (row.attempts, row.locked_by, [e["type"] for e in row.errors]) == (
            1,
            None,
            [TIMEOUT],
        )
    row = Job.objects.get(id=later.id)
    assert (row.attempts, row.locked_by) == (0, None)
    assert not Audit.objects.filter(label="after-the-stuck-ones").exists()
    assert not WorkerBeat.objects.exists()  # it left as a clean exit does
    assert sampler.threads <= 2 + 2, sampler.threads
    if POSTGRES:
        assert sampler.sessions <= 2 + 2, sampler.sessions


@pytest.mark.slow
def test_jobs_status_shows_abandoned_handlers_and_sigterm_records_their_timeout(
    handlers, worker_process, capsys
):
    job = enqueue(handlers["plain"], {"seconds": 600, "label": "plain"})
    settings = json.dumps({"MAINTENANCE_INTERVAL": 0.5, "WORKER_EXPIRY": 5})
    worker, sampler = _sampled(
        worker_process,
        "--concurrency",
        "2",
        "--grace",
        "2",
        extra_env={"JOBS_TEST_SETTINGS": settings},
    )
    wait_for(
        lambda: WorkerBeat.objects.filter(stats__abandoned=1).exists(),
        timeout=30,
        message="the heartbeat row to count the abandoned handler",
    )
    # Still leased to the worker, under a lease its heartbeat extends: the job holds its slot.
    assert Job.objects.filter(id=job.id, locked_by__isnull=False).exists()
    call_command("jobs", "status")
    out = capsys.readouterr().out
    assert "1 of 2 thread(s) run handlers abandoned past their timeout" in out
    call_command("jobs", "status", "--json")
    (shown,) = json.loads(capsys.readouterr().out)["workers"]
    assert (shown["abandoned"], shown["running"]) == (1, 1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    sampler.stop()
    assert "exiting with 1 handler(s) still running past their timeout" in worker.output()
    row = Job.objects.get(id=job.id)
    assert (row.attempts, row.locked_by, [e["type"] for e in row.errors]) == (1, None, [TIMEOUT])
    assert sampler.threads <= 2 + 2 and (not POSTGRES or sampler.sessions <= 2 + 2)


# ---- in-process: the attempt's outcome, and the late return fenced ---------------------


@pytest.mark.parametrize("kind", ["plain", "atomic"])
def test_a_timed_out_attempt_is_retried_only_once_its_handler_returned(handlers, run_worker, kind):
    """TimeoutError twice, then attempts_exhausted; no second run beside the first; no marker."""
    job = enqueue(handlers[kind], {"seconds": 1.0, "label": kind})  # timeout 0.3 s, 2 attempts
    worker = run_worker(concurrency=2)
    letter = DeadLetter.objects.get(id=job.id)
    assert (letter.reason, [e["type"] for e in letter.errors]) == (
        DeadReason.ATTEMPTS_EXHAUSTED,
        [TIMEOUT, TIMEOUT],
    )
    assert not CompletionMarker.objects.exists()
    intervals = _intervals(kind)
    if kind == "atomic":
        assert intervals == {}  # the late commit was rolled back, each time
    else:
        assert len(intervals) == 2 and all(end for _, end in intervals.values())
        assert _max_overlap(intervals.values()) == 1  # attempt 2 started after 1 returned
    assert worker.stats.retried == 1 and worker.stats.abandoned == 0


@pytest.mark.slow
def test_a_burst_worker_waits_grace_for_an_abandoned_handler_then_records_its_timeout(
    handlers, worker_process
):
    """A handler back 0.3 s late fills both threads a moment, then frees them: no exit 3."""
    stuck = enqueue(handlers["plain"], {"seconds": 600, "label": "forever"})
    late = enqueue(handlers["plain"], {"seconds": 0.6, "label": "late"})
    others = [enqueue(jobs.record, {"label": f"other-{i}"}).id for i in range(5)]
    worker, sampler = _sampled(worker_process, "--burst", "--concurrency", "2", "--grace", "1")
    code = worker.wait(timeout=60)
    sampler.stop()
    log = worker.output()
    assert code == 0, log[-3000:]
    assert "exiting with 1 handler(s) still running past their timeout" in log
    letter = DeadLetter.objects.get(id=late.id)  # it returned each time: retried, then dead
    assert [e["type"] for e in letter.errors] == [TIMEOUT, TIMEOUT]
    row = Job.objects.get(id=stuck.id)  # held (never run twice) until the worker left
    assert (row.attempts, row.locked_by, [e["type"] for e in row.errors]) == (1, None, [TIMEOUT])
    assert len(_intervals("forever")) == 1
    assert CompletionMarker.objects.filter(job_id__in=others).count() == 5
    assert sampler.threads <= 2 + 2 and (not POSTGRES or sampler.sessions <= 2 + 2)
