"""Real `runjobs` processes serving two job databases ("default" and "jobs2"): SIGKILLs,
fairness between a flooded database and a quiet one, and one of them going down.

"jobs2" is a second PostgreSQL server on PostgreSQL runs (the cluster dev.py starts on
port 5433), a second SQLite file, or a second MariaDB database (tests/settings.py).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest
from django.db import DatabaseError, connections
from django.db.models import Count, Max

from django_jobs import enqueue_many
from django_jobs.models import CompletionMarker, DeadLetter, Job
from tests.conftest import ENGINE, wait_for
from tests.testapp.jobs import record_where
from tests.testapp.models import Audit

DATABASES = ["default", "jobs2"]
pytestmark = [pytest.mark.django_db(databases=DATABASES, transaction=True), pytest.mark.slow]

# Per database. SQLite takes one writer at a time per file: fewer there.
STORM_JOBS = int(os.environ.get("JOBS_STORM_JOBS", 2_000 if ENGINE == "sqlite" else 5_000))
STORM_SECONDS = 30  # at most; the storm blows until three quarters of the jobs are done
LABEL = {"default": "d", "jobs2": "j"}


def _enqueue(alias, total, prefix, delay=None, **payload):
    """Enqueue `total` record_where jobs on alias; return their ids."""
    payloads = [{"label": f"{prefix}-{i}", **payload} for i in range(total)]
    chunk = 1_000  # SQLite caps a statement's variables
    return {
        result.id
        for start in range(0, total, chunk)
        for result in enqueue_many(
            record_where, payloads[start : start + chunk], using=alias, delay=delay
        )
    }


def _done(alias):
    return CompletionMarker.objects.using(alias).count()


def _queued(alias):
    return Job.objects.using(alias).count()


@pytest.mark.mariadb
def test_a_kill_storm_across_two_databases_runs_every_job_exactly_once(
    two_job_databases, worker_process
):
    ids = {alias: _enqueue(alias, STORM_JOBS, LABEL[alias]) for alias in DATABASES}
    total = sum(len(each) for each in ids.values())
    args = ("--concurrency", "4", "--lease", "2", "--poll-interval", "0.1")

    def start():
        return worker_process(*args, extra_env=two_job_databases)

    workers = [start() for _ in range(3)]
    started = time.monotonic()
    rng = random.Random(28)
    kills = 0
    while (
        time.monotonic() - started < STORM_SECONDS
        and sum(_done(alias) for alias in DATABASES) < total * 3 // 4
    ):
        time.sleep(rng.uniform(0.5, 1.0))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
        kills += 1
        workers.append(start())
    done_at_last_kill = sum(_done(alias) for alias in DATABASES)
    wait_for(
        lambda: all(_done(alias) == STORM_JOBS and not _queued(alias) for alias in DATABASES),
        timeout=240,
        interval=0.5,
        message=f"all {total} jobs done on both databases",
    )
    elapsed = time.monotonic() - started
    for worker in workers:
        worker.wait_serving()  # the last one started may still be loading Django
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait(timeout=30) for w in workers] == [0, 0, 0], [w.output()[-3000:] for w in workers]
    retried = 0
    for alias in DATABASES:
        audits = Audit.objects.using(alias)
        per_job = dict(audits.values_list("job_id").annotate(n=Count("id")))
        assert set(per_job) == ids[alias]  # every job's effect, in its own database ...
        assert set(per_job.values()) == {1}  # ... exactly once
        assert not audits.exclude(label__startswith=f"{LABEL[alias]}-").exists()
        markers = CompletionMarker.objects.using(alias)
        assert set(markers.values_list("job_id", flat=True)) == ids[alias]
        assert markers.aggregate(m=Max("attempts"))["m"] <= record_where.max_attempts
        retried += markers.filter(attempts__gte=2).count()
        assert not DeadLetter.objects.using(alias).exists()
        assert not Job.objects.using(alias).exists()
    assert kills >= 5, f"three quarters of the jobs were done after {kills} kill(s)"
    assert retried, "no kill landed on a claimed job"
    print(
        f"{ENGINE}: 3 processes x 2 databases x {STORM_JOBS} atomic jobs, {kills} SIGKILLs "
        f"({done_at_last_kill}/{total} done at the last), {retried} job(s) rescued: "
        f"{elapsed:.1f}s ({total / elapsed:.0f} jobs/s)"
    )


@pytest.mark.mariadb
@pytest.mark.parametrize("flooded", DATABASES)
def test_a_flooded_database_leaves_the_other_its_own_slots(
    two_job_databases, worker_process, flooded
):
    quiet = next(alias for alias in DATABASES if alias != flooded)
    flood = 3_000
    _enqueue(flooded, flood, "flood", ms=40)  # 2 threads: about 50 jobs/s, a minute in all
    worker = worker_process("--concurrency", "2", extra_env=two_job_databases)
    wait_for(lambda: _done(flooded) >= 20, timeout=30, message="the flood to be running")
    _enqueue(quiet, 20, "quiet")
    started = time.monotonic()
    wait_for(lambda: _done(quiet) == 20, timeout=20, message="the quiet database's 20 jobs")
    waited = time.monotonic() - started
    left = _queued(flooded)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    print(f"{ENGINE}: 20 jobs on {quiet} done in {waited:.2f}s, {left}/{flood} of the flood left")
    # Behind the flood, in one line, they would have waited for most of it (a minute).
    assert left >= flood * 2 // 3
    assert Audit.objects.using(quiet).count() == 20


# The jobs2 cluster of the PostgreSQL runs (dev.py's ensure_second_postgres).
JOBS2_CLUSTER = ["15", "jobs2"]
JOBS2_PORT = os.environ.get("JOBS2_PGPORT", "5433")


def _cluster(action, *extra):
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *JOBS2_CLUSTER, action, *extra],
        check=True,
        capture_output=True,
    )


def _jobs2_ready():
    return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", JOBS2_PORT]).returncode == 0


def _on_jobs2(count):
    """count() on jobs2, reconnecting first (the server was restarted under the test)."""
    connections["jobs2"].close()
    try:
        return count()
    except DatabaseError:
        return None


@pytest.mark.postgres
@pytest.mark.chaos
def test_a_job_database_going_down_stops_only_its_own_jobs(two_job_databases, worker_process):
    # Due while jobs2 is down: its worker can run them only once the server is back.
    _enqueue("jobs2", 30, "before", delay=10)
    worker = worker_process("--concurrency", "2", "--lease", "3", extra_env=two_job_databases)
    _enqueue("default", 10, "up")
    wait_for(lambda: _done("default") == 10, message="default's first jobs")
    served = 10
    assert _done("jobs2") == 0, "jobs2's jobs ran before the stop"
    # And some running when it stops: their transactions die with the server.
    running = _enqueue("jobs2", 4, "running", ms=2_000)
    wait_for(
        lambda: (
            Job.objects.using("jobs2").filter(id__in=running, locked_by__isnull=False).count() >= 2
        ),
        message="jobs2's long jobs to be claimed",
    )
    time.sleep(0.3)  # into their handlers
    try:
        _cluster("stop", "-m", "fast")
        assert not _jobs2_ready()
        down_at = time.monotonic()
        # jobs2 stays down for 15 s (its jobs come due meanwhile): default is served all along.
        slowest = 0.0
        while time.monotonic() - down_at < 15:
            _enqueue("default", 10, f"down-{served}")
            served += 10
            enqueued = time.monotonic()
            wait_for(
                lambda n=served: _done("default") == n,
                timeout=5,
                message=f"default's jobs while jobs2 is down ({served - 10} done before)",
            )
            slowest = max(slowest, time.monotonic() - enqueued)
            time.sleep(0.5)
        assert worker.proc.poll() is None, worker.output()[-3000:]
    finally:
        if not _jobs2_ready():
            _cluster("start")
        wait_for(_jobs2_ready, timeout=60, interval=0.2, message="jobs2 to accept connections")
    wait_for(
        lambda: _on_jobs2(lambda: _done("jobs2")) == 34,
        timeout=30,
        interval=0.3,
        message="jobs2's jobs once it is back",
    )
    assert not Job.objects.using("jobs2").exists()
    per_job = dict(Audit.objects.using("jobs2").values_list("job_id").annotate(n=Count("id")))
    assert len(per_job) == 34 and set(per_job.values()) == {1}  # the killed ones rolled back
    markers = CompletionMarker.objects.using("jobs2").filter(job_id__in=running)
    assert markers.filter(attempts__gte=2).exists()  # cut short by the stop, run again
    assert worker.proc.poll() is None, worker.output()[-3000:]
    _enqueue("default", 5, "after")
    wait_for(lambda: _done("default") == served + 5, message="default's jobs after")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    output = worker.output()
    # Only jobs2's worker saw errors: default's never lost a connection nor waited.
    ids = dict(re.findall(r"worker (\S+) starting: database=(\S+) ", output))
    assert sorted(ids.values()) == DATABASES, output[:3000]
    troubled = set(re.findall(r"worker (\S+): (?:database error|listener lost)", output))
    assert {ids[worker_id] for worker_id in troubled} == {"jobs2"}
    print(
        f"default served {served} jobs while jobs2 was down 15 s (10 at a time, the slowest "
        f"10 in {slowest:.2f}s); jobs2's 34 run after, once each"
    )


@pytest.mark.postgres
@pytest.mark.chaos
def test_a_worker_starts_and_stops_while_a_job_database_is_down(two_job_databases, worker_process):
    """runjobs starts with jobs2 down (serving default), and exits at once on SIGTERM."""
    _enqueue("jobs2", 20, "before")
    try:
        _cluster("stop", "-m", "fast")
        worker = worker_process("--concurrency", "2", extra_env=two_job_databases)
        _enqueue("default", 10, "down")
        wait_for(lambda: _done("default") == 10, timeout=30, message="default's jobs")
        _cluster("start")
        wait_for(_jobs2_ready, timeout=60, interval=0.2, message="jobs2 to accept connections")
        wait_for(
            lambda: _on_jobs2(lambda: _done("jobs2")) == 20,
            timeout=30,
            interval=0.3,
            message="jobs2's jobs once it is back",
        )
        _cluster("stop", "-m", "fast")
        _enqueue("default", 10, "down-again")
        wait_for(lambda: _done("default") == 20, message="default's jobs, jobs2 down again")
        stopping = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
        took = time.monotonic() - stopping
    finally:
        if not _jobs2_ready():
            _cluster("start")
        wait_for(_jobs2_ready, timeout=60, interval=0.2, message="jobs2 to accept connections")
        connections["jobs2"].close()
    assert took < 10  # its jobs2 worker's retries wake for the stop
    assert "could not check the migrations on database 'jobs2'" in worker.output()
    print(f"started with jobs2 down, served both once it was back; SIGTERM: {took:.1f}s")
