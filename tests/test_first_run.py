"""A new project's first run, against a real fresh database: forgotten migrate, idle workers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ENGINE, POSTGRES, ROOT, throwaway_postgres_database

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_database(tmp_path):
    """Return the NAME of a database that exists but was never migrated."""
    if ENGINE not in ("postgres", "sqlite"):
        pytest.skip(f"no throwaway database is made on {ENGINE}")
    if not POSTGRES:
        yield str(tmp_path / "fresh.sqlite3")
        return
    with throwaway_postgres_database(f"django_jobs_fresh_{uuid.uuid4().hex[:12]}") as name:
        yield name


def manage(database, *args, timeout=60, extra_env=None):
    """Run `python -m django ARGS` on the test project with NAME = database."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DB_NAME": database,
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_runjobs_refuses_an_unmigrated_database_with_one_line(fresh_database):
    done = manage(fresh_database, "runjobs", timeout=30)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "python manage.py migrate" in lines[0]
    assert "'default'" in lines[0]
    # Once migrated, the same command runs.
    assert manage(fresh_database, "migrate", "-v", "0").returncode == 0
    done = manage(fresh_database, "runjobs", "--burst", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


# Every command that reads or writes the job tables, each action of `jobs` included.
TABLE_COMMANDS = [
    ["jobs", "status"],
    ["jobs", "status", "--json"],
    ["jobs", "pause", "default"],
    ["jobs", "resume", "default"],
    ["jobs", "schedules"],
    ["jobs", "enable", "nightly"],
    ["jobs", "disable", "nightly"],
    ["jobs", "cancel", "00000000-0000-0000-0000-000000000001"],
    ["jobs", "cancel", "--workflow", "nightly"],
    ["replayjobs", "--all"],
    ["prunejobs"],
    ["prunejobs", "--dry-run"],
]

CALL_EACH = f"""
from django.core.management import call_command
from django.core.management.base import CommandError
for args in {TABLE_COMMANDS!r}:
    try:
        call_command(*args)
    except CommandError as exc:
        print(" ".join(args), exc.returncode, exc, sep="|")
    except Exception as exc:
        print(" ".join(args), "raised", type(exc).__name__, exc, sep="|")
"""


def test_every_table_command_refuses_an_unmigrated_database_as_runjobs_does(fresh_database):
    # One process for all of them (Django starts once); runjobs' test above covers the exit.
    done = manage(fresh_database, "shell", "-c", CALL_EACH)
    assert done.returncode == 0, done.stderr
    runjobs = manage(fresh_database, "runjobs", timeout=30).stderr.strip()
    lines = [line for line in done.stdout.splitlines() if "|" in line]
    assert [line.split("|")[0] for line in lines] == [" ".join(a) for a in TABLE_COMMANDS]
    for line in lines:
        _, returncode, message = line.split("|", 2)
        assert returncode == "1", line
        assert f"CommandError: {message}" == runjobs, line


def test_check_database_reports_unapplied_migrations(fresh_database):
    done = manage(fresh_database, "check", "--database", "default")
    assert "django_jobs.W020" in done.stderr, done.stderr + done.stdout
    assert "python manage.py migrate" in done.stderr
    # Without --database, no database is queried: nothing to say.
    assert "W020" not in manage(fresh_database, "check").stderr
    # `migrate` runs the database checks too, just before it applies the migrations: silent.
    done = manage(fresh_database, "migrate", "-v", "0")
    assert done.returncode == 0
    assert "W020" not in done.stderr + done.stdout
    done = manage(fresh_database, "check", "--database", "default")
    assert done.returncode == 0
    assert "W020" not in done.stderr


ENQUEUE = """
from django_jobs import enqueue, enqueue_many
for call in (lambda: enqueue("tests.noop", {}), lambda: enqueue_many("tests.noop", [{}, {}])):
    try:
        call()
    except Exception as exc:
        print(type(exc).__module__, type(exc).__name__, exc, sep="|")
"""


def test_enqueue_on_an_unmigrated_database_names_the_fix(fresh_database):
    done = manage(fresh_database, "shell", "-c", ENQUEUE)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "|" in line]
    assert len(lines) == 2, done.stdout + done.stderr
    for line in lines:
        module, name, message = line.split("|")
        # Still the database error callers catch, now saying what to do.
        assert module == "django.db.utils"
        assert name == ("ProgrammingError" if POSTGRES else "OperationalError")
        assert "run `python manage.py migrate`" in message
        assert "django_jobs_job" in message


# ---- SQLite with Django's defaults -------------------------------------------------

ORDERS = """
import threading
from django.db import transaction
from django_jobs import enqueue_on_commit
from tests.testapp.models import Audit

errors = []

def place(start):
    for i in range(start, start + {per_thread}):
        try:
            with transaction.atomic():
                Audit.objects.filter(label="order").count()  # read first, as a view does
                Audit.objects.create(label="order", attempt=i)
                enqueue_on_commit("tests.record_atomic", {{"label": f"a{{i}}"}})
                enqueue_on_commit("tests.record", {{"label": f"r{{i}}"}})
        except Exception as exc:
            errors.append(repr(exc))

threads = [threading.Thread(target=place, args=(n * 1000,)) for n in range({threads})]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("errors", len(errors), errors[:3])
"""


def _sqlite_count(path, query):
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path, timeout=30)) as db:
        return db.execute(query).fetchone()[0]


def test_sqlite_without_options_shares_the_file_between_web_and_workers(tmp_path):
    """200 orders from 4 threads while 2 workers run, on a SQLite file with no OPTIONS."""
    from tests.conftest import WorkerProcess, wait_for

    path = str(tmp_path / "shop.sqlite3")
    settings = {"DJANGO_SETTINGS_MODULE": "tests.plain_sqlite_settings"}
    assert manage(path, "migrate", "-v", "0", extra_env=settings).returncode == 0
    env = {
        **os.environ,
        **settings,
        "TEST_DB_NAME": path,
        "PYTHONPATH": str(ROOT),
        "JOBS_TEST_SETTINGS": '{"BACKOFF": 0.5}',
    }
    workers = [
        WorkerProcess(["--concurrency", "4", "-v", "0"], tmp_path / f"worker-{n}.log", env)
        for n in range(2)
    ]
    try:
        done = manage(
            path,
            "shell",
            "-c",
            ORDERS.format(threads=4, per_thread=50),
            extra_env=settings,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert "errors 0 []" in done.stdout, done.stdout
        wait_for(
            lambda: _sqlite_count(path, "SELECT count(*) FROM django_jobs_marker") == 400,
            timeout=120,
            message="400 completion markers",
        )
    finally:
        for worker in workers:
            worker.signal(__import__("signal").SIGTERM)
        codes = [worker.wait(timeout=60) for worker in workers]
        logs = "".join(worker.output() for worker in workers)
        for worker in workers:
            worker.stop()
    assert codes == [0, 0], logs
    assert "database is locked" not in logs
    assert _sqlite_count(path, "SELECT count(*) FROM django_jobs_marker WHERE attempts > 1") == 0
    assert _sqlite_count(path, "SELECT count(*) FROM django_jobs_deadletter") == 0
    assert _sqlite_count(path, "PRAGMA journal_mode") == "wal"


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({}, False),
        ({"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}, False),
        ({"transaction_mode": "DEFERRED"}, True),
        ({"init_command": "PRAGMA journal_mode=DELETE"}, True),
    ],
)
def test_check_warns_about_sqlite_options_that_undo_concurrency(tmp_path, options, warned):
    import json

    done = manage(
        str(tmp_path / "db.sqlite3"),
        "check",
        extra_env={
            "DJANGO_SETTINGS_MODULE": "tests.plain_sqlite_settings",
            "JOBS_SQLITE_OPTIONS": json.dumps(options),
        },
    )
    assert done.returncode == 0, done.stderr
    assert ("django_jobs.W021" in done.stderr) is warned, done.stderr
    if warned:
        assert '"transaction_mode": "IMMEDIATE"' in done.stderr


# ---- the app missing from INSTALLED_APPS -------------------------------------------


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("django.tasks") is None,
    reason="Django's Tasks framework needs Django >= 6.0",
)
def test_check_says_django_jobs_is_missing_from_installed_apps(tmp_path):
    done = manage(
        str(tmp_path / "db.sqlite3"),
        "check",
        extra_env={"DJANGO_SETTINGS_MODULE": "tests.no_app_settings"},
    )
    assert done.returncode == 1
    assert "System check identified no issues" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "django.core.exceptions.ImproperlyConfigured: TASKS uses "
        "django_jobs.backend.JobsBackend, but 'django_jobs' is not in INSTALLED_APPS: add it "
        "(and 'rangefilter' for the admin), then run `python manage.py migrate`"
    )


# ---- a worker with nothing to do, a queue nobody serves ------------------------------


def test_runjobs_warns_when_no_handler_is_registered(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    env = {"DJANGO_SETTINGS_MODULE": "tests.plain_sqlite_settings", "JOBS_NO_HANDLERS": "1"}
    assert manage(path, "migrate", "-v", "0", extra_env=env).returncode == 0
    done = manage(path, "runjobs", "--burst", extra_env=env)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "handler" in line]
    assert warnings == [
        "no job handler is registered, so this worker cannot run any job: declare @job "
        "functions in a jobs.py module of an app in INSTALLED_APPS"
    ], done.stderr


def test_runjobs_warns_about_served_queues_no_handler_declares(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    env = {"DJANGO_SETTINGS_MODULE": "tests.plain_sqlite_settings"}
    assert manage(path, "migrate", "-v", "0", extra_env=env).returncode == 0
    done = manage(path, "runjobs", "--burst", "-q", "emails", "-q", "emials", extra_env=env)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "declares" in line]
    assert warnings == [
        "no registered handler declares queue 'emials': this worker runs its jobs only when "
        "they were enqueued with queue='emials'"
    ], done.stderr
    # The default queues are every handler's: nothing to say.
    done = manage(path, "runjobs", "--burst", extra_env=env)
    assert "declares" not in done.stderr and "no job handler" not in done.stderr


def test_importing_the_enqueue_api_without_the_app_names_the_fix(tmp_path):
    done = manage(
        str(tmp_path / "db.sqlite3"),
        "shell",
        "-c",
        "from django_jobs import enqueue_on_commit",
        extra_env={"DJANGO_SETTINGS_MODULE": "tests.no_app_settings"},
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: 'django_jobs' is not in INSTALLED_APPS: "
        "add it (and 'rangefilter' for the admin), then run `python manage.py migrate`"
    )


# ---- 'rangefilter' forgotten: the admin would fail on its first page ----------------


def test_check_says_rangefilter_is_missing_from_installed_apps(settings):
    from django.core.checks import run_checks

    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rangefilter"]
    errors = [e for e in run_checks(tags=["admin"]) if e.id == "django_jobs.E015"]
    assert len(errors) == 1
    assert "'rangefilter'" in errors[0].msg and "INSTALLED_APPS" in errors[0].hint
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "rangefilter"]
    assert not [e for e in run_checks(tags=["admin"]) if e.id.startswith("django_jobs.")]
