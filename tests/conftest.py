"""Shared fixtures: the database in use, worker runs in-process and as real processes."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_jobs import control
from django_jobs.worker import Worker
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory, WorkerBeatFactory

ROOT = Path(__file__).resolve().parent.parent

# The admin tests' users and clients (make_user, login, admin_client_).
pytest_plugins = ["tests.admin_fixtures"]
ENGINE = os.environ.get("TEST_DB", "postgres")  # postgres, sqlite or mariadb (tests/settings.py)
POSTGRES = ENGINE == "postgres"
# dev.py's pgbouncer run: PostgreSQL through PgBouncer in transaction pooling.
PGBOUNCER = POSTGRES and os.environ.get("JOBS_PGBOUNCER") == "1"


# One line of figures per fault test (tests/test_chaos.py), repeated at the end of the run.
CHAOS_LINES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if CHAOS_LINES:
        terminalreporter.section("chaos figures")
        for line in CHAOS_LINES:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    if POSTGRES:
        return
    skip = pytest.mark.skip(reason=f"needs PostgreSQL (this run uses {ENGINE})")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def refused_poison_markers():
    """Make the database refuse (by a trigger) a completion marker whose result is "poison"."""
    if POSTGRES:
        statements = [
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.result = '\"poison\"'::jsonb THEN RAISE EXCEPTION 'poisoned result'; "
            "END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON django_jobs_marker "
            "FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ]
        cleanup = [
            "DROP TRIGGER refuse_poison ON django_jobs_marker",
            "DROP FUNCTION refuse_poison()",
        ]
    elif ENGINE == "mariadb":
        # A SIGNAL arrives as an OperationalError (error 1644), not as a lost connection.
        statements = [
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON django_jobs_marker FOR EACH ROW "
            "IF JSON_UNQUOTE(NEW.result) = 'poison' THEN "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned result'; END IF"
        ]
        cleanup = ["DROP TRIGGER refuse_poison"]
    else:
        statements = [
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON django_jobs_marker "
            "WHEN json_extract(NEW.result, '$') = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'poisoned result'); END"
        ]
        cleanup = ["DROP TRIGGER refuse_poison"]
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for statement in cleanup:
                cursor.execute(statement)


@pytest.fixture
def run_worker():
    """Run an in-process worker in burst mode until nothing is due; return it."""

    def run(**options):
        options.setdefault("burst", True)
        options.setdefault("concurrency", 2)
        worker = Worker(**options)
        worker.run()
        return worker

    return run


@pytest.fixture
def status_rows():
    """Known rows in every table `jobs status` and the metrics read, relative to now."""
    now = timezone.now()
    for age in (120, 30, 5):
        JobFactory(queue="default", run_at=now - timedelta(seconds=age))
    JobFactory(queue="default", run_at=now + timedelta(minutes=5))
    JobFactory(queue="default", run_at=now + timedelta(hours=2))
    JobFactory(queue="default", leased=True)
    JobFactory(queue="emails", run_at=now - timedelta(seconds=10))
    for minutes in (1, 10, 59):
        MarkerFactory(queue="default", completed_at=now - timedelta(minutes=minutes))
    MarkerFactory(queue="emails", completed_at=now - timedelta(minutes=2))
    MarkerFactory(queue="default", completed_at=now - timedelta(minutes=61))
    DeadLetterFactory(queue="default", dead_at=now - timedelta(minutes=3))
    DeadLetterFactory(queue="default", dead_at=now - timedelta(hours=3))
    control.pause(["emails"])
    WorkerBeatFactory(id="h:1:aa", pid=1)
    WorkerBeatFactory(id="h:2:bb", pid=2, last_seen_at=now - timedelta(minutes=5))  # stale
    return now


class WorkerProcess:
    """A real `manage.py runjobs` process, its output kept in a file."""

    def __init__(self, args, log_path, env):
        self.log_path = log_path
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runjobs", *args],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self):
        return self.proc.pid

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.flush()

    def output(self):
        self.log.flush()
        return Path(self.log_path).read_text(errors="replace")

    def wait_serving(self, timeout=30):
        """Wait for its "starting" line: from then on a SIGTERM is a graceful stop.

        Before it (Django still loading), SIGTERM ends the process as it ends any
        other, status -15: a test that stops a worker it has just started waits here.
        """
        wait_for(
            lambda: " starting: " in self.output() or self.proc.poll() is not None,
            timeout=timeout,
            message="the worker to start",
        )
        assert self.proc.poll() is None, self.output()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def worker_process(tmp_path):
    """Start real runjobs processes on the test database; kill leftovers afterwards."""
    started = []
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        # MariaDB's checks connect to every database: "other" has a test database
        # only when a test of this run asked for it.
        "TEST_OTHER_DB_NAME": str(
            connections["other"].settings_dict["NAME"]
            if connections["other"].settings_dict["NAME"].startswith("test_")
            else connection.settings_dict["NAME"]
        ),
        # The second job database's test database, when a test of this run asked for it.
        **(
            {"TEST_JOBS2_DB_NAME": str(connections["jobs2"].settings_dict["NAME"])}
            if os.path.basename(str(connections["jobs2"].settings_dict["NAME"])).startswith("test_")
            else {}
        ),
        "PYTHONPATH": str(ROOT),
    }

    def start(*args, extra_env=None):
        log = tmp_path / f"worker-{len(started)}.log"
        proc = WorkerProcess(list(args), log, {**env, **(extra_env or {})})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


# What a test of several job databases sets, in its process and in its workers'.
TWO_DATABASES = ["default", "jobs2"]
TWO_DATABASES_ENV = {"JOBS_TEST_SETTINGS": json.dumps({"DATABASES": TWO_DATABASES})}


@pytest.fixture
def two_job_databases(settings):
    """DJANGO_JOBS["DATABASES"] = ["default", "jobs2"]; return the env its workers need.

    "jobs2" is a second PostgreSQL server (dev.py starts it), a second SQLite file, or a
    second MariaDB database; the test asks for it with django_db(databases=[...]).
    """
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASES": TWO_DATABASES}
    return TWO_DATABASES_ENV


@contextlib.contextmanager
def unreachable(alias):
    """Point alias's connection at a server that is not there (a missing file on SQLite)."""
    conn = connections[alias]
    conn.close()
    kept = dict(conn.settings_dict)
    if conn.vendor == "sqlite":
        conn.settings_dict["NAME"] = "/nonexistent/dir/jobs.sqlite3"
    else:
        conn.settings_dict.update(HOST="127.0.0.1", PORT="1")  # nothing listens there
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(kept)


@contextlib.contextmanager
def throwaway_postgres_database(name, also_drop=()):
    """Create PostgreSQL database `name` (never migrated); drop it, and `also_drop`, after."""
    import psycopg

    params = {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "password": os.environ.get("PGPASSWORD", ""),
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**params) as admin:
            for database in (name, *also_drop):
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that runs a subprocess on a clock `offset` away ("+10m"), monotonic time kept."""
    libraries = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert libraries, "libfaketime is needed (Debian package faketime; .ci/run installs it)"
    return {"LD_PRELOAD": libraries[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def wait_for(predicate, timeout=30.0, interval=0.05, message="condition"):
    """Poll predicate until it returns a truthy value; fail after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@pytest.fixture(autouse=True)
def _no_leaked_connections(request):
    """Fail a test whose worker threads left database sessions open behind them."""
    yield
    if not POSTGRES or "django_db" not in request.keywords:
        return
    if PGBOUNCER:  # the pooler keeps its own server sessions; the direct runs check leaks
        return
    marker = request.node.get_closest_marker("django_db")
    if not (marker and marker.kwargs.get("transaction")):
        return
    deadline = time.monotonic() + 5
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            others = cursor.fetchone()[0]
        if not others or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert others == 0, f"{others} database session(s) still open after the test"
