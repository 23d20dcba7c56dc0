#!/usr/bin/env python
"""django-jobs benchmarks against the local PostgreSQL, with Django's default settings.

    python3 dev.py bench            # full run: medians of 3, about five minutes
    python3 dev.py bench --quick    # smoke run: a few hundred jobs, one run each
    python3 dev.py bench --compare  # E1, D1, D2: PostgreSQL's fast path, its ORM claim, MariaDB
    python3 dev.py bench --engine mariadb   # E1, E1a, E2, W1, D1, D2, RP on MariaDB (mysqlclient)
    python3 dev.py bench --claim orm        # every figure with DJANGO_JOBS["CLAIM"] = "orm"
    python3 dev.py bench --tracing          # OpenTelemetry on (SDK, spans dropped): its cost

Figures (no-op jobs, as the peers were measured):
  E1   enqueue_on_commit, one job per call, autocommit            (jobs/s)
  E1a  the same inside transaction.atomic(), one job per transaction
  E2   enqueue_many of 10,000 jobs in one call (COPY)              (jobs/s)
  W1   workflow() of 10,000 steps after one, and one after them all (steps/s)
  D1   drain 10,000 due jobs, one runjobs process                  (jobs/s)
  WF   a workflow: one root, 10,000 steps after it, one final step after them all,
       drained by one runjobs process as D1                         (steps/s)
  D2   the same, two runjobs processes                             (jobs/s)
  D2X  D2's jobs spread over two job databases, half each (a second PostgreSQL server,
       JOBS2_PGPORT, 5433), one runjobs process per database        (jobs/s)
  D1X  the same jobs, one runjobs process serving both (a worker per database)
  D1F  D1 with flow limits configured on other handlers of the queue (jobs/s)
  D1M  D1 by a serving worker (--max-jobs, not --burst) that has async handlers too (jobs/s)
  RP   replay 10,000 dead letters in one call, half of them keyed  (letters/s)
  CAP  a handler capped by global_concurrency=4, 50 ms jobs, 2 workers (% of 80/s)
  CAP0 the same jobs without a limit on one worker of 4 threads, for comparison
  RL   claims of one job of a rate-limited handler (1,000,000/h, fixed window)   (ms/claim)
  RLS  the same in a sliding window: its log of an hour of claims read and pruned (ms/claim)
  IO10 5,000 async jobs each awaiting 10 ms, one runjobs process at its defaults (jobs/s)
  IOS  the same with a sync handler calling time.sleep(0.01), --concurrency 100
  IO1  IO10 with 1 ms awaits (compare with D1)
  IOT  1,000 async jobs in flight in one process: its threads and peak RSS (MB)
  L1   enqueue-commit to handler start at 20 and 500 jobs/s, p50 and p99, and its parts (ms);
       its floor: a NOTIFY and one claim round trip in raw psycopg, with the claim's WAL
       flushed and with synchronous_commit off (what any worker pays on this machine)
  idle CPU of a waiting worker (% of one core) and its database round trips per poll
  claim median with 1,000 jobs vs 1,000,000 scheduled + 100,000 due (ms, and the ratio)
  peak RSS of one worker (concurrency 4) draining 100,000 jobs     (MB)
  pgbench single-row INSERT per transaction, one client, for scale (tx/s)

It creates its own database (BENCH_DB, default django_jobs_bench) and drops it at the end;
D2X and D1X also BENCH_DB + "_jobs2" on the second server (skipped when it is not there).
Not a test: nothing here fails on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
DB = os.environ.setdefault("BENCH_DB", "django_jobs_bench")
PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": os.environ.get("PGPORT", "5432"),
    "user": os.environ.get("PGUSER", "postgres"),
}
# D2X, D1X: the second job database, on a second server (bench/settings.py's "jobs2").
DB2 = DB + "_jobs2"
PG2 = {
    **PG,
    "host": os.environ.get("JOBS2_PGHOST", "127.0.0.1"),
    "port": os.environ.get("JOBS2_PGPORT", "5433"),
}
TWO_DATABASES = "default,jobs2"


# --engine mariadb (BENCH_ENGINE): only these figures; the others read PostgreSQL's
# statistics or run its claim statement.
MARIADB_FIGURES = {"E1", "E1A", "E2", "W1", "D1", "D2", "RP"}
# --compare: these figures for the fast path, the ORM claim, and MariaDB.
COMPARE = (("postgres", "auto"), ("postgres", "orm"), ("mariadb", "auto"))


def mariadb() -> bool:
    return os.environ.get("BENCH_ENGINE") == "mariadb"


def admin(sql: str, dbname: str = "postgres", server: dict[str, str] = PG) -> list[tuple]:
    if mariadb():
        import MySQLdb

        conn = MySQLdb.connect(
            host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
            port=int(os.environ.get("MYSQL_PORT", "3306")),
            user=os.environ.get("MYSQL_USER", "root"),
            password=os.environ.get("MYSQL_PASSWORD", ""),
            **({} if dbname == "postgres" else {"database": dbname}),
            autocommit=True,
        )
        try:
            cur = conn.cursor()
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(dbname=dbname, autocommit=True, **server) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def create_database() -> None:
    if mariadb():
        admin(f"DROP DATABASE IF EXISTS `{DB}`")
        admin(f"CREATE DATABASE `{DB}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return
    admin(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{DB}"')


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    admin(
        f"DROP DATABASE IF EXISTS `{DB}`"
        if mariadb()
        else f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'
    )
    if not mariadb() and second_server():
        admin(f'DROP DATABASE IF EXISTS "{DB2}" WITH (FORCE)', server=PG2)


def second_server() -> bool:
    """Whether the second PostgreSQL server of D2X and D1X answers (dev.py starts it)."""
    import psycopg

    try:
        admin("SELECT 1", server=PG2)
    except psycopg.OperationalError:
        return False
    return True


def create_second_database() -> None:
    """Make BENCH_DB + "_jobs2" on the second server, with the job tables."""
    from django.core.management import call_command

    admin(f'DROP DATABASE IF EXISTS "{DB2}" WITH (FORCE)', server=PG2)
    admin(f'CREATE DATABASE "{DB2}"', server=PG2)
    call_command("migrate", database="jobs2", verbosity=0)


TABLES = ("django_jobs_job", "django_jobs_marker", "django_jobs_deadletter")


def reset(dbname: str = DB, server: dict[str, str] = PG) -> None:
    """Empty the job tables and vacuum them, so every run starts alike."""
    if mariadb():
        for table in (*TABLES, "django_jobs_dependency", "django_jobs_workflow_step"):
            admin(f"TRUNCATE TABLE {table}", DB)
        admin("ANALYZE TABLE django_jobs_job", DB)
        return
    admin(
        "TRUNCATE django_jobs_job, django_jobs_marker, django_jobs_deadletter, "
        "django_jobs_dependency, django_jobs_workflow_step",
        dbname,
        server,
    )
    admin("VACUUM ANALYZE django_jobs_job", dbname, server)


def compare(args: argparse.Namespace) -> int:
    """Print E1, D1 and D2 for PostgreSQL's fast path, its ORM claim and MariaDB, side by side."""
    rows = []
    for engine, claim in COMPARE:
        command = [sys.executable, __file__, "--engine", engine, "--claim", claim]
        command += ["--only", "E1,D1,D2", *(["--quick"] if args.quick else [])]
        command += ["--runs", str(args.runs)] if args.runs else []
        print(f"  {engine}, claim {claim} ...", flush=True)  # noqa: T201
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stdout[-2000:] + out.stderr[-2000:])  # noqa: T201
            return out.returncode
        for line in out.stdout.splitlines():
            if line.startswith(("| E1 ", "| D1 ", "| D2 ")):
                rows.append(f"| {engine}, {claim} | {line[2:]}")
    print("| database, claim | figure | median | min–max | target |")  # noqa: T201
    print("|---|---|---|---|---|")  # noqa: T201
    print("\n".join(rows))  # noqa: T201
    return 0


def spawn_worker(
    *args: str, flow: bool = False, io: bool = False, databases: str = ""
) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **({"BENCH_FLOW": "1"} if flow else {}),
        **({"BENCH_IO": "1"} if io else {}),
        **({"BENCH_DATABASES": databases} if databases else {}),
    }
    # Its log goes to a file, not a pipe: at the default -v 1 a worker writes a line per
    # job, which would fill a pipe nobody reads while it runs and block the worker.
    log = tempfile.TemporaryFile()  # read and closed in finish()
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runjobs", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, timeout: float = 600) -> None:
    proc.wait(timeout=timeout)
    log = proc.log  # type: ignore[attr-defined]
    log.seek(0)
    err = log.read()
    log.close()
    if proc.returncode not in (0,):
        raise RuntimeError(f"worker exited {proc.returncode}: {err.decode()[-2000:]}")


# ---- figures ----------------------------------------------------------------


def enqueue_one_by_one(n: int, atomic: bool) -> float:
    from django.db import transaction

    from bench.benchapp.jobs import noop
    from django_jobs import enqueue_on_commit

    reset()
    started = time.perf_counter()
    for i in range(n):
        if atomic:
            with transaction.atomic():
                enqueue_on_commit(noop, {"i": i})
        else:
            enqueue_on_commit(noop, {"i": i})
    return n / (time.perf_counter() - started)


def enqueue_bulk(n: int) -> float:
    from bench.benchapp.jobs import noop
    from django_jobs import enqueue_many

    reset()
    payloads = [{"i": i} for i in range(n)]
    started = time.perf_counter()
    enqueue_many(noop, payloads)
    return n / (time.perf_counter() - started)


def enqueue_workflow(n: int) -> float:
    """One workflow() of n + 2 steps: one root, n steps after it, one step after them all."""
    from bench.benchapp.jobs import noop
    from django_jobs import workflow

    reset()
    started = time.perf_counter()
    with workflow(name="bench") as w:
        root = w.enqueue(noop, {"i": -1})
        middle = [w.enqueue(noop, {"i": i}, after=[root]) for i in range(n)]
        w.enqueue(noop, {"i": n}, after=middle)
    return (n + 2) / (time.perf_counter() - started)


def fill(n: int, using: str | None = None) -> None:
    from bench.benchapp.jobs import noop
    from django_jobs import enqueue_many

    for start in range(0, n, 10_000):
        payloads = [{"i": i} for i in range(start, min(n, start + 10_000))]
        enqueue_many(noop, payloads, using=using)


def drain(n: int, workers: int, flow: bool = False, serving: bool = False) -> float:
    from django.db.models import Max, Min

    from django_jobs.models import CompletionMarker, Job

    reset()
    fill(n)
    # serving: a worker as production runs it (not --burst: it exits after n jobs),
    # with async handlers registered beside the sync ones it drains (BENCH_IO).
    mode = ("--max-jobs", str(n)) if serving else ("--burst",)
    procs = [spawn_worker(*mode, flow=flow, io=serving) for _ in range(workers)]
    for proc in procs:
        finish(proc)
    assert Job.objects.count() == 0, "jobs left after the drain"
    assert CompletionMarker.objects.count() == n, "a job without its marker"
    span = CompletionMarker.objects.aggregate(first=Min("started_at"), last=Max("completed_at"))
    return n / (span["last"] - span["first"]).total_seconds()


def drain_two_databases(n: int, processes: int) -> float:
    """D2's n jobs, half on each job database; drained by a process per database, or one.

    The rate runs from the first start to the last completion over both databases (the
    two servers share this machine's clock).
    """
    from django.conf import settings
    from django.db.models import Max, Min
    from django.test import override_settings

    from django_jobs.models import CompletionMarker, Job

    reset()
    reset(DB2, PG2)
    aliases = TWO_DATABASES.split(",")
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "DATABASES": aliases}):
        for index, alias in enumerate(aliases):
            fill(n // 2 + (n % 2 if index == 0 else 0), using=alias)
    served = [("--database", alias) for alias in aliases] if processes == 2 else [()]
    procs = [spawn_worker("--burst", *each, databases=TWO_DATABASES) for each in served]
    for proc in procs:
        finish(proc)
    spans = []
    for alias in aliases:
        assert not Job.objects.using(alias).exists(), f"jobs left on {alias} after the drain"
        markers = CompletionMarker.objects.using(alias)
        spans.append(markers.aggregate(first=Min("started_at"), last=Max("completed_at")))
    assert sum(CompletionMarker.objects.using(a).count() for a in aliases) == n
    first = min(span["first"] for span in spans)
    last = max(span["last"] for span in spans)
    return n / (last - first).total_seconds()


def _fill_named(name: str, n: int, payload: dict) -> None:
    """Enqueue n jobs of a handler the benchmark process has not registered (BENCH_IO's)."""
    from django_jobs import enqueue_many
    from django_jobs.registry import job

    handler = job(name=name)(lambda payload, ctx: None)  # a stand-in: the worker has the real one
    try:
        for start in range(0, n, 10_000):
            enqueue_many(handler, [payload] * min(10_000, n - start))
    finally:
        from django_jobs.registry import unregister

        unregister(name)


def io(n: int, seconds: float, kind: str) -> float:
    """Drain n jobs that wait `seconds` each: awaiting (async) or in time.sleep (sync)."""
    from django.db.models import Max, Min

    from django_jobs.models import CompletionMarker, Job

    reset()
    if kind == "async":
        _fill_named("bench.await", n, {"s": seconds})
        proc = spawn_worker("--burst", io=True)
    else:
        _fill_named("bench.block", n, {"s": seconds})
        proc = spawn_worker("--burst", "--concurrency", "100", io=True)
    finish(proc)
    assert Job.objects.count() == 0, "jobs left after the drain"
    assert CompletionMarker.objects.count() == n, "a job without its marker"
    span = CompletionMarker.objects.aggregate(first=Min("started_at"), last=Max("completed_at"))
    return n / (span["last"] - span["first"]).total_seconds()


def in_flight(n: int, seconds: float) -> tuple[float, float]:
    """Threads and peak RSS (MB) of one worker holding n async jobs that await `seconds`."""
    from django_jobs.models import CompletionMarker

    reset()
    _fill_named("bench.await", n, {"s": seconds})
    proc = spawn_worker("--burst", "--async-concurrency", str(n), io=True)
    threads = peak = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
                elif line.startswith("Threads:"):
                    threads = max(threads, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    finish(proc)
    assert CompletionMarker.objects.count() == n
    return float(threads), peak / 1024


def workflow_drain(n: int) -> float:
    """Return the steps per second of one worker draining a fan-out and fan-in of n steps.

    The steps are written first (not timed): one root, n steps after it, one final
    step after all n. The root's settle releases the n, the last of them the final one.
    """
    from django.db import transaction
    from django.db.models import Max, Min

    from bench.benchapp.jobs import noop
    from django_jobs import workflow
    from django_jobs.models import CompletionMarker, Job

    reset()
    with transaction.atomic(), workflow(name="bench") as w:
        root = w.enqueue(noop, {"root": True})
        middle = [w.enqueue(noop, {"i": i}, after=[root]) for i in range(n)]
        final = w.enqueue(noop, {"final": True}, after=middle)
    proc = spawn_worker("--burst")
    finish(proc)
    assert Job.objects.count() == 0, "steps left after the drain"
    assert CompletionMarker.objects.count() == n + 2, "a step without its marker"
    others = CompletionMarker.objects.exclude(job_id=final.id).aggregate(Max("completed_at"))
    last = CompletionMarker.objects.get(job_id=final.id)
    assert last.started_at >= others["completed_at__max"], "the final step ran too early"
    span = CompletionMarker.objects.aggregate(first=Min("started_at"), last=Max("completed_at"))
    return (n + 2) / (span["last"] - span["first"]).total_seconds()


def replay(n: int) -> float:
    """Return the letters per second of one replay() of n dead letters (every other keyed).

    The letters are written first (not timed), as a worker leaves them: no edges,
    no workflow steps; DeadLetterQuerySet.replay makes a job of each.
    """
    from django.utils import timezone

    from django_jobs.models import DeadLetter, DeadReason, Job
    from django_jobs.rows import uuid7

    reset()
    now = timezone.now()
    DeadLetter.objects.bulk_create(
        [
            DeadLetter(
                id=uuid7(),
                name="bench.noop",
                queue="default",
                payload=f'{{"i": {i}}}',
                key=f"bench-{i}" if i % 2 else None,
                attempts=5,
                max_attempts=5,
                reason=DeadReason.ATTEMPTS_EXHAUSTED,
                error="bench.Error: failed",
                errors=[],
                enqueued_at=now,
                dead_at=now,
            )
            for i in range(n)
        ],
        batch_size=2_000,
    )
    from django_jobs import control

    started = time.perf_counter()
    report = control.replay(DeadLetter.objects.all(), by="bench")
    elapsed = time.perf_counter() - started
    assert len(report.replayed) == n, f"replayed {report}"
    assert Job.objects.count() == n, "a letter without its job"
    return n / elapsed


def capped(n: int, limited: bool = True) -> float:
    """Return the rate of a handler capped by global_concurrency, as % of CAP / CAPPED_SECONDS.

    Not limited (CAP0): the same jobs, no limit, on one worker with CAP threads: what
    the worker reaches on this machine without flow control, for comparison.
    """
    from django.db.models import Max, Min

    from bench.benchapp.jobs import CAP, CAPPED_SECONDS
    from django_jobs import enqueue_many
    from django_jobs.models import CompletionMarker, Job

    reset()
    name = "bench.capped" if limited else "bench.sleep"
    # Enqueued by name: only the workers (BENCH_FLOW=1) register bench.capped.
    from django_jobs.registry import Handler, register, unregister

    if limited:
        register(Handler(func=lambda payload, ctx: None, name=name))
    try:
        enqueue_many(name, [{"i": i} for i in range(n)])
    finally:
        if limited:
            unregister(name)
    if limited:
        procs = [spawn_worker("--concurrency", str(CAP), flow=True) for _ in range(2)]
    else:
        procs = [spawn_worker("--concurrency", str(CAP))]
    deadline = time.monotonic() + 600
    while CompletionMarker.objects.count() < n and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        finish(proc, 60)
    assert Job.objects.count() == 0, "jobs left after the capped drain"
    span = CompletionMarker.objects.aggregate(first=Min("started_at"), last=Max("completed_at"))
    rate = n / (span["last"] - span["first"]).total_seconds()
    return 100 * rate / (CAP / CAPPED_SECONDS)


def rate_limited_claims(n: int, sliding: bool) -> float:
    """Return the milliseconds of one claim of one job of a rate-limited group, in process.

    The rate never fills (1,000,000/h), so every claim takes a job; an hourly window
    is a sliding window's largest log: the claim reads every claim of the run.
    """
    from django.db import connection

    from django_jobs import enqueue_many, flow
    from django_jobs.registry import Handler, register, unregister
    from django_jobs.rows import ClaimRequest
    from django_jobs.store import JobStore

    reset()
    with connection.cursor() as cursor:  # each run counts from an empty window
        cursor.execute("TRUNCATE django_jobs_flow_start, django_jobs_flow_window")
    name = "bench.rated"
    register(Handler(func=lambda payload, ctx: None, name=name))
    try:
        enqueue_many(name, [{"i": i} for i in range(n)])
    finally:
        unregister(name)
    rate = flow.parse_rate("1000000/h", window="sliding" if sliding else "fixed")
    limit = flow.Limit("name", name, None, rate)
    store = JobStore()
    started = time.perf_counter()
    for i in range(n):
        request = ClaimRequest(
            queues=["default"], limit=1, token=f"bench#{i}", lease=600, flow_limits=[limit]
        )
        assert len(store.claim(request)) == 1, "a claim took no job"
    return 1000 * (time.perf_counter() - started) / n


def latency(rate: float, seconds: float) -> tuple[float, float, float, float]:
    """Return p50 and p99 of enqueue-commit to handler start, and the p50 of its two parts.

    The parts: commit to the claim's start (NOTIFY delivery, the listener's hand-off,
    the dispatcher waking), and the claim's start to the handler's (the claim's round
    trip and the hand-off to a thread).
    """
    from bench.benchapp.jobs import started
    from django_jobs import enqueue_on_commit
    from django_jobs.models import CompletionMarker

    reset()
    worker = spawn_worker()
    time.sleep(2.0)  # let it connect and LISTEN
    committed = {}
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for _ in range(int(rate * seconds)):
        result = enqueue_on_commit(started, None)
        committed[result.id] = time.time()
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))
    deadline = time.monotonic() + 30
    while CompletionMarker.objects.count() < len(committed) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    finish(worker, 30)
    rows = list(CompletionMarker.objects.values_list("job_id", "result"))
    assert len(rows) == len(committed), "some jobs did not run"
    waits = sorted((start - committed[job_id]) * 1000 for job_id, (start, _) in rows)
    wake = sorted((claimed - committed[job_id]) * 1000 for job_id, (_, claimed) in rows)
    claim = sorted((start - claimed) * 1000 for _, (start, claimed) in rows)
    return (
        _percentile(waits, 50),
        _percentile(waits, 99),
        _percentile(wake, 50),
        _percentile(claim, 50),
    )


# L1's floor: what one NOTIFY and one claim round trip cost on this machine, without
# Django or django-jobs. This process (the enqueuer) commits an INSERT and a pg_notify
# and notes the time; the listener (another process, raw psycopg) waits for the
# notification and, on the connection that received it, runs one prepared UPDATE ...
# RETURNING that leases the row, and notes the time the answer arrived.
_FLOOR_LISTENER = """
import json, os, sys, time
import psycopg

conn = psycopg.connect(os.environ["FLOOR_DSN"], autocommit=True)
if os.environ["FLOOR_SYNC"] == "off":
    conn.execute("SET synchronous_commit = off")
conn.execute("LISTEN bench_floor")
print("ready", flush=True)
claimed = {}
want = int(os.environ["FLOOR_N"])
while len(claimed) < want:
    noted = list(conn.notifies(timeout=10, stop_after=1))
    if not noted:
        break
    for row in conn.execute(
        "UPDATE bench_floor SET claimed = true WHERE id = (SELECT id FROM bench_floor"
        " WHERE NOT claimed ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id",
        prepare=True,
    ):
        claimed[row[0]] = time.time()
print(json.dumps(claimed), flush=True)
"""


def latency_floor(rate: float, seconds: float, synchronous: bool) -> tuple[float, float]:
    """p50 and p99 of commit to a claim's answer, raw psycopg: L1's floor on this machine.

    A NOTIFY and one claim round trip on the listening connection, no Django, no
    thread hand-off: what any worker pays before its own work. `synchronous`: the
    claim commits as PostgreSQL's default does (its WAL flushed); else
    synchronous_commit = off.
    """
    import psycopg

    reset()
    dsn = " ".join(f"{key}={value}" for key, value in {**PG, "dbname": DB}.items())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_floor")
        conn.execute(
            "CREATE TABLE bench_floor (id bigserial PRIMARY KEY, claimed boolean DEFAULT false)"
        )
        count = int(rate * seconds)
        env = {
            **os.environ,
            "FLOOR_DSN": dsn,
            "FLOOR_N": str(count),
            "FLOOR_SYNC": "on" if synchronous else "off",
        }
        listener = subprocess.Popen(
            [sys.executable, "-c", _FLOOR_LISTENER], env=env, stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready", "the floor's listener did not start"
        committed = {}
        interval = 1.0 / rate
        next_at = time.perf_counter()
        for _ in range(count):
            with conn.transaction():
                [(job_id,)] = conn.execute("INSERT INTO bench_floor DEFAULT VALUES RETURNING id")
                conn.execute("SELECT pg_notify('bench_floor', '')")
            committed[job_id] = time.time()
            next_at += interval
            time.sleep(max(0.0, next_at - time.perf_counter()))
        out, _ = listener.communicate(timeout=60)
        conn.execute("DROP TABLE bench_floor")
    claimed = {int(key): at for key, at in json.loads(out.strip().splitlines()[-1]).items()}
    assert len(claimed) == count, "the floor's listener missed notifications"
    waits = sorted((claimed[job_id] - at) * 1000 for job_id, at in committed.items())
    return _percentile(waits, 50), _percentile(waits, 99)


def _percentile(values: list[float], pct: float) -> float:
    index = max(0, min(len(values) - 1, round(pct / 100 * len(values) + 0.5) - 1))
    return values[index]


def idle(seconds: float) -> tuple[float, float]:
    """CPU share of a waiting worker, and its database round trips per poll interval.

    Round trips are the worker's own sendto() calls, counted by strace (each query
    is one); without strace, transactions on the database (which autovacuum can
    inflate) stand in for them.
    """
    from django_jobs import conf

    reset()
    worker = spawn_worker()
    time.sleep(3.0)

    def cpu_ticks() -> int:
        fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def transactions() -> int:
        [(count,)] = admin(
            f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{DB}'"
        )
        return count

    ticks, xacts = cpu_ticks(), transactions()
    if shutil.which("strace"):
        strace = ["strace", "-f", "-c", "-e", "trace=sendto", "-p", str(worker.pid)]
        traced = subprocess.run(
            ["timeout", str(seconds), *strace], capture_output=True, text=True, check=False
        )
        sends = [
            line.split() for line in traced.stderr.splitlines() if line.rstrip().endswith("sendto")
        ]
        trips = int(sends[0][3]) if sends else 0
    else:
        time.sleep(seconds)
        trips = transactions() - xacts
    ticks = cpu_ticks() - ticks
    worker.send_signal(signal.SIGTERM)
    finish(worker, 30)
    cpu = ticks / os.sysconf("SC_CLK_TCK") / seconds * 100
    polls = seconds / conf.get("POLL_INTERVAL")
    return cpu, trips / polls


def claim_at_scale(scheduled: int, due: int, samples: int) -> tuple[float, float, float]:
    from django.db import connection

    from django_jobs.store import sql

    def median_claim() -> float:
        times = []
        with connection.cursor() as cursor:
            for n in range(samples):
                cursor.execute("BEGIN")
                started = time.perf_counter()
                cursor.execute(sql.CLAIM, sql.claim_params(["default"], 100, f"bench#{n}", 30))
                cursor.fetchall()
                times.append((time.perf_counter() - started) * 1000)
                cursor.execute("ROLLBACK")  # leave the table as it was for the next sample
        return statistics.median(times)

    reset()
    admin(_insert_jobs(1_000, "now() - interval '1 minute'"), DB)
    admin("ANALYZE django_jobs_job", DB)
    small = median_claim()
    reset()
    admin(_insert_jobs(scheduled, "now() + interval '1 day' + g * interval '1 second'"), DB)
    admin(_insert_jobs(due, "now() - interval '1 minute'"), DB)
    admin("VACUUM ANALYZE django_jobs_job", DB)
    big = median_claim()
    return small, big, big / small


def _insert_jobs(count: int, run_at: str) -> str:
    return f"""
        INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, enqueued_at,
                                     attempts, max_attempts, errors)
        SELECT gen_random_uuid(), 'bench.noop', 'default', '{{}}', 0, {run_at}, now(), 0, 5, '[]'
        FROM generate_series(1, {count}) AS g
    """


def memory(n: int) -> tuple[float, float]:
    from django_jobs.models import CompletionMarker

    reset()
    fill(n)
    worker = spawn_worker("--burst", "--concurrency", "4")
    peak = 0
    status = Path(f"/proc/{worker.pid}/status")
    started = time.perf_counter()
    while worker.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    finish(worker)
    elapsed = time.perf_counter() - started
    assert CompletionMarker.objects.count() == n
    return peak / 1024, n / elapsed


def pgbench_insert_tps(seconds: int) -> float:
    admin("CREATE TABLE IF NOT EXISTS pgbench_single (id bigserial PRIMARY KEY, x int)", DB)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("INSERT INTO pgbench_single (x) VALUES (1);\n")
    env = {**os.environ, "PGHOST": PG["host"], "PGPORT": PG["port"], "PGUSER": PG["user"]}
    out = subprocess.run(
        ["pgbench", "-n", "-c", "1", "-T", str(seconds), "-f", script.name, DB],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    os.unlink(script.name)
    for line in out.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise RuntimeError(out)


# ---- the table ------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run with a few hundred jobs")
    parser.add_argument("--runs", type=int, help="runs per figure (default 3; 1 with --quick)")
    parser.add_argument("--only", help="comma-separated figures to run, e.g. D1,D2")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    parser.add_argument(
        "--engine",
        choices=["postgres", "mariadb"],
        default="postgres",
        help="mariadb: the local MariaDB (127.0.0.1:3306, root), figures E1, E1A, E2, W1, D1, D2",
    )
    parser.add_argument(
        "--claim", choices=["auto", "orm"], default="auto", help='DJANGO_JOBS["CLAIM"]'
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry on (the SDK, spans dropped): what traces cost, in every process",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="E1, D1, D2 of PostgreSQL's fast path, its ORM claim and MariaDB, side by side",
    )
    args = parser.parse_args()
    if args.compare:
        return compare(args)
    os.environ["BENCH_ENGINE"] = args.engine
    os.environ["BENCH_CLAIM"] = args.claim
    os.environ["BENCH_TRACING"] = "1" if args.tracing else "0"
    quick = args.quick
    runs = args.runs or (1 if quick else 3)
    size = {
        "enqueue": 300 if quick else 5_000,
        "bulk": 500 if quick else 10_000,
        "drain": 500 if quick else 10_000,
        "latency_s": 2 if quick else 10,
        "idle_s": 2 if quick else 10,
        "scheduled": 10_000 if quick else 1_000_000,
        "due": 1_000 if quick else 100_000,
        "memory": 2_000 if quick else 100_000,
        "pgbench_s": 2 if quick else 10,
    }
    only = set(args.only.upper().split(",")) if args.only else None
    if mariadb():
        only = (only or MARIADB_FIGURES) & MARIADB_FIGURES

    create_database()
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)

    figures: list[tuple[str, str, list[float], str]] = []

    def measure(key: str, fn, *fn_args) -> list[float]:
        if only and key not in only:
            return []
        return [fn(*fn_args) for _ in range(runs)]

    def add(key, label, unit, target, values):
        if values:
            figures.append((key, label + f" ({unit})", values, target))
            print(f"  {key:<5} {label}: {_fmt(values)} {unit}", flush=True)  # noqa: T201

    print(
        f"django-jobs benchmarks on {DB} ({args.engine}, claim {args.claim}"
        f"{', tracing on' if args.tracing else ''}; "
        f"{'quick' if quick else f'medians of {runs}'})",
        flush=True,
    )  # noqa: T201
    add(
        "E1",
        "enqueue_on_commit, autocommit",
        "jobs/s",
        ">= 2,000",
        measure("E1", enqueue_one_by_one, size["enqueue"], False),
    )
    add(
        "E1A",
        "enqueue_on_commit, one atomic() per job",
        "jobs/s",
        "",
        measure("E1A", enqueue_one_by_one, size["enqueue"], True),
    )
    add(
        "E2",
        f"enqueue_many of {size['bulk']:,}",
        "jobs/s",
        ">= 50,000",
        measure("E2", enqueue_bulk, size["bulk"]),
    )
    add(
        "W1",
        f"workflow() of {size['bulk']:,} steps, fan-out and fan-in",
        "steps/s",
        "",
        measure("W1", enqueue_workflow, size["bulk"]),
    )
    add(
        "D1",
        f"drain {size['drain']:,}, 1 worker",
        "jobs/s",
        ">= 6,000",
        measure("D1", drain, size["drain"], 1),
    )
    add(
        "WF",
        f"workflow 1 -> {size['drain']:,} -> 1 steps, 1 worker",
        "steps/s",
        "",
        measure("WF", workflow_drain, size["drain"]),
    )
    add(
        "D2",
        f"drain {size['drain']:,}, 2 workers",
        "jobs/s",
        ">= 8,000",
        measure("D2", drain, size["drain"], 2),
    )
    two = [] if (only and not only & {"D2X", "D1X"}) or mariadb() else ["D2X", "D1X"]
    if two and not second_server():
        print(f"  D2X, D1X skipped: no PostgreSQL at {PG2['host']}:{PG2['port']}")  # noqa: T201
        two = []
    if two:
        create_second_database()
    add(
        "D2X",
        f"drain {size['drain']:,} over 2 job databases, 1 worker process each",
        "jobs/s",
        "",
        measure("D2X", drain_two_databases, size["drain"], 2) if two else [],
    )
    add(
        "D1X",
        f"drain {size['drain']:,} over 2 job databases, 1 worker process serving both",
        "jobs/s",
        "",
        measure("D1X", drain_two_databases, size["drain"], 1) if two else [],
    )
    add(
        "D1M",
        f"drain {size['drain']:,}, 1 serving worker (not --burst) with async handlers too",
        "jobs/s",
        "within 10% of D1",
        measure("D1M", drain, size["drain"], 1, False, True),
    )
    add(
        "D1F",
        f"drain {size['drain']:,}, 1 worker, flow limits on other handlers",
        "jobs/s",
        "within 10% of D1",
        measure("D1F", drain, size["drain"], 1, True),
    )
    add(
        "RP",
        f"replay {size['bulk']:,} dead letters",
        "letters/s",
        ">= 3,333",
        measure("RP", replay, size["bulk"]),
    )
    add(
        "CAP",
        "global_concurrency=4 of 50 ms jobs, 2 workers",
        "% of 80/s",
        ">= 90",
        measure("CAP", capped, 100 if quick else 800),
    )
    add(
        "CAP0",
        "the same jobs without a limit, 1 worker x 4 threads",
        "% of 80/s",
        "",
        measure("CAP0", capped, 100 if quick else 800, False),
    )
    add(
        "RL",
        "claims of one rate-limited job, fixed window",
        "ms/claim",
        "",
        measure("RL", rate_limited_claims, 200 if quick else 2_000, False),
    )
    add(
        "RLS",
        "the same, sliding window",
        "ms/claim",
        "within 10% of RL",
        measure("RLS", rate_limited_claims, 200 if quick else 2_000, True),
    )
    io_jobs = 500 if quick else 5_000
    add(
        "IO10",
        f"{io_jobs:,} async jobs awaiting 10 ms, runjobs defaults",
        "jobs/s",
        ">= 8,000",
        measure("IO10", io, io_jobs, 0.01, "async"),
    )
    add(
        "IOS",
        f"{io_jobs:,} sync jobs in time.sleep(0.01), --concurrency 100",
        "jobs/s",
        "<= IO10",
        measure("IOS", io, io_jobs, 0.01, "sync"),
    )
    add(
        "IO1",
        f"{io_jobs:,} async jobs awaiting 1 ms, runjobs defaults",
        "jobs/s",
        ">= 80% of D1",
        measure("IO1", io, io_jobs, 0.001, "async"),
    )
    if not only or "IOT" in only:
        held = 200 if quick else 1_000
        threads, rss = in_flight(held, 3.0)
        add("IOT", f"threads of one worker with {held:,} async jobs in flight", "", "", [threads])
        add("IOT", f"peak RSS with {held:,} async jobs in flight", "MB", "", [rss])
    if not only or "L1" in only:
        for rate in (20, 500):
            found = [latency(rate, size["latency_s"]) for _ in range(runs)]
            p50, p99 = ("<= 1.0", "<= 2.5") if rate == 20 else ("", "")
            add("L1", f"enqueue to start p50 at {rate}/s", "ms", p50, [p[0] for p in found])
            add("L1", f"enqueue to start p99 at {rate}/s", "ms", p99, [p[1] for p in found])
            add("L1", f"  commit to claim p50 at {rate}/s", "ms", "", [p[2] for p in found])
            add("L1", f"  claim to handler p50 at {rate}/s", "ms", "", [p[3] for p in found])
        for synchronous in (True, False):
            floors = [latency_floor(20, size["latency_s"], synchronous) for _ in range(runs)]
            how = "WAL flushed" if synchronous else "synchronous_commit off"
            add("L1", f"  floor p50 at 20/s, {how}", "ms", "", [f[0] for f in floors])
            add("L1", f"  floor p99 at 20/s, {how}", "ms", "", [f[1] for f in floors])
    if not only or "IDLE" in only:
        pairs = [idle(size["idle_s"]) for _ in range(runs)]
        add("IDLE", "idle worker CPU", "% of a core", "< 1", [p[0] for p in pairs])
        add("IDLE", "idle round trips per poll", "", "<= 1", [p[1] for p in pairs])
    if not only or "SCALE" in only:
        small, big, ratio = claim_at_scale(size["scheduled"], size["due"], 15 if quick else 50)
        add("SCALE", "claim of 100, 1,000 jobs", "ms", "", [small])
        add(
            "SCALE",
            f"claim of 100, {size['scheduled']:,} scheduled + {size['due']:,} due",
            "ms",
            "",
            [big],
        )
        add("SCALE", "ratio big / small", "x", "<= 2", [ratio])
    if not only or "MEM" in only:
        peak, rate = memory(size["memory"])
        add("MEM", f"peak RSS, concurrency 4, {size['memory']:,} jobs", "MB", "< 100", [peak])
    if not only or "PGBENCH" in only:
        add(
            "PGB",
            "pgbench single-row INSERT, 1 client",
            "tx/s",
            "",
            [pgbench_insert_tps(size["pgbench_s"]) for _ in range(runs)],
        )

    print()  # noqa: T201
    print("| figure | median | min–max | target |\n|---|---|---|---|")  # noqa: T201
    for key, label, values, target in figures:
        print(  # noqa: T201
            f"| {key} {label} | {_num(statistics.median(values))} | "
            f"{_num(min(values))}–{_num(max(values))} | {target} |"
        )
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / "latest.json").write_text(
        json.dumps({label: values for _, label, values, _ in figures}, indent=2)
    )
    if not args.keep:
        drop_database()
    return 0


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def _fmt(values: list[float]) -> str:
    return (
        f"median {_num(statistics.median(values))} "
        f"(min {_num(min(values))}, max {_num(max(values))})"
    )


if __name__ == "__main__":
    sys.exit(main())
