"""The `jobs` and `jobs_drain` pytest fixtures, in real pytest-django runs in a subprocess.

Each run has its own settings (written next to its test files): a "real" database
holding one waiting job, as a developer's has, and pytest-django's test database
beside it. A test that asks only for `jobs` must run on the test database, never
on the real one, whatever else the session holds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.conftest import ENGINE, POSTGRES, ROOT

pytestmark = pytest.mark.slow

SETTINGS = """
from tests.settings import *  # noqa: F403

NAMES = [("default", {real!r}, {test!r}), ("other", {other!r}, {other_test!r})]
DATABASES = {{
    alias: {{**DATABASES[alias], "NAME": name, "TEST": {{**DATABASES[alias].get("TEST", {{}})}}}}
    for alias, name, _ in NAMES
}}
for alias, _, test in NAMES:
    DATABASES[alias]["TEST"]["NAME"] = test
"""

# Run alone, each in its own session: nothing else asks for `db`.
ALONE = {
    "test_jobs_alone.py": """
from django.db import connection


def test_jobs_alone_is_on_the_test_database(jobs):
    assert connection.settings_dict["NAME"] == TEST_NAME
    assert jobs.enqueued_jobs() == []  # the real database holds one
    assert jobs.drain().attempts == []
    assert not connection.get_autocommit()  # in pytest-django's test transaction
""",
    "test_jobs_drain_alone.py": """
from django.db import connection


def test_jobs_drain_alone_is_on_the_test_database(jobs_drain):
    assert connection.settings_dict["NAME"] == TEST_NAME
    assert jobs_drain().attempts == []
""",
    "test_jobs_with_transactional_db_alone.py": """
from django.db import connection


def test_transactional_db_wins_over_jobs(jobs, transactional_db):
    assert connection.settings_dict["NAME"] == TEST_NAME
    assert connection.get_autocommit()
    assert jobs.enqueued_jobs() == []
""",
}

TOGETHER = """
import pytest
from django.db import connection, connections

from django_jobs import enqueue
from tests.testapp import jobs as handlers
from tests.testapp.models import Audit


def test_jobs_gives_the_helpers_and_database_access(jobs):
    enqueue(handlers.record, {"label": "fixture"})
    jobs.assert_enqueued(handlers.record, {"label": "fixture"})
    assert len(jobs.drain().succeeded) == 1
    assert Audit.objects.get().label == "fixture"
    assert not connection.get_autocommit()  # pytest-django's test transaction


def test_jobs_drain_is_drain(jobs_drain):
    enqueue(handlers.flaky, {"succeed_on": 2})
    assert [a.outcome for a in jobs_drain().attempts] == ["retried", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_keeps_its_mode(jobs):
    assert connection.get_autocommit()
    enqueue(handlers.record, {"label": "committed"})
    assert len(jobs.drain().succeeded) == 1


def test_transactional_db_keeps_its_mode(transactional_db, jobs):
    assert connection.get_autocommit()
    assert jobs.enqueued_jobs() == []  # the previous test's job was flushed


@pytest.mark.django_db(databases=["default", "other"])
def test_a_marks_databases_hold(jobs):
    assert connections["other"].settings_dict["NAME"] == OTHER_TEST_NAME
    Audit.objects.using("other").create(label="other")
    assert jobs.enqueued_jobs() == []


def test_nothing_happens_without_asking():
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        Audit.objects.count()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, django_db_blocker):
    """Settings with a real database (migrated, one waiting job) and an env to run them."""
    tmp_path = tmp_path_factory.mktemp("plugin")
    if ENGINE == "sqlite":
        names = {
            "real": str(tmp_path / "real.sqlite3"),
            "test": str(tmp_path / "test_real.sqlite3"),
            "other": str(tmp_path / "other.sqlite3"),
            "other_test": str(tmp_path / "test_other.sqlite3"),
        }
    else:
        # Its own databases, next to this run's (MariaDB names are at most 64
        # characters, and no path: a file name of SQLite's is no database name there).
        base = os.environ.get("JOBS_TEST_DB", "django_jobs") + "_plugin"
        names = {
            "real": base,
            "test": f"test_{base}",
            "other": f"{base}_other",
            "other_test": f"test_{base}_other",
        }
    (tmp_path / "plugin_settings.py").write_text(SETTINGS.format(**names))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "DJANGO_SETTINGS_MODULE": "plugin_settings",
    }
    for name in ("TEST_DB_NAME", "TEST_OTHER_DB_NAME"):
        env.pop(name, None)

    def run(*args, timeout=300):
        return subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def server(statement):
        with django_db_blocker.unblock(), connection.creation._nodb_cursor() as cursor:
            cursor.execute(statement)

    quote = '"' if POSTGRES else "`"
    if ENGINE != "sqlite":
        server(f"DROP DATABASE IF EXISTS {quote}{names['real']}{quote}")
        server(f"CREATE DATABASE {quote}{names['real']}{quote}")
    try:
        migrated = run("-m", "django", "migrate", "--noinput", "-v0")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        enqueued = run(
            "-m",
            "django",
            "shell",
            "--no-imports",
            "-c",
            "from django_jobs import enqueue; from tests.testapp import jobs; "
            "enqueue(jobs.record, {'label': 'real'})",
        )
        assert enqueued.returncode == 0, enqueued.stdout + enqueued.stderr
        yield tmp_path, names, run
    finally:
        if ENGINE != "sqlite":
            server(f"DROP DATABASE IF EXISTS {quote}{names['real']}{quote}")


def real_database(run):
    """Return (live jobs, audit rows) of the real database."""
    out = run(
        "-m",
        "django",
        "shell",
        "--no-imports",
        "-c",
        "from django_jobs.models import Job; from tests.testapp.models import Audit; "
        "print('rows', Job.objects.count(), Audit.objects.count())",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    _, jobs, audits = out.stdout.splitlines()[-1].split()
    return int(jobs), int(audits)


def pytest_run(run, *files):
    return run("-m", "pytest", "-q", "-p", "no:cacheprovider", *files)


def test_a_test_asking_only_for_jobs_runs_on_the_test_database_when_alone(project):
    tmp_path, names, run = project
    assert real_database(run) == (1, 0)
    for file, text in ALONE.items():
        (tmp_path / file).write_text(text.replace("TEST_NAME", repr(names["test"])))
        out = pytest_run(run, file)
        assert out.returncode == 0, f"{file}:\n{out.stdout[:8000]}{out.stderr[-3000:]}"
        assert "1 passed" in out.stdout
    # The developer's job still waits in the real database, not run by drain().
    assert real_database(run) == (1, 0)


def test_the_fixtures_keep_each_tests_database_mode(project):
    """The pytest11 entry point loads the fixtures; they are opt-in (no autouse)."""
    tmp_path, names, run = project
    (tmp_path / "test_plugin_use.py").write_text(
        TOGETHER.replace("OTHER_TEST_NAME", repr(names["other_test"]))
    )
    out = pytest_run(run, "test_plugin_use.py")
    assert out.returncode == 0, out.stdout[:8000] + out.stderr[-3000:]
    assert "6 passed" in out.stdout
    assert real_database(run) == (1, 0)


def test_without_pytest_django_the_fixtures_are_the_helpers(project):
    """-p no:django: no `db` to ask for, and the fixtures still load."""
    tmp_path, _, run = project
    (tmp_path / "test_no_django.py").write_text(
        "import django\n\ndjango.setup()\n\n\ndef test_the_helpers(jobs, jobs_drain):\n"
        "    assert jobs_drain is jobs.drain\n"
        "    assert callable(jobs.assert_enqueued)\n"
    )
    out = run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:django", "test_no_django.py"
    )
    assert out.returncode == 0, out.stdout[:8000] + out.stderr[-3000:]
    assert "1 passed" in out.stdout
