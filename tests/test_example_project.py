"""The README's first command: the example project's demo, on a fresh SQLite file."""

import os
import sqlite3
import subprocess
import sys
from importlib.util import find_spec

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.skipif(
    find_spec("django.tasks") is None,
    reason="the example project uses django.tasks (Django >= 6.0)",
)
def test_demo_shows_jobs_done_and_a_dead_letter(tmp_path):
    database = tmp_path / "demo.sqlite3"
    earlier = sqlite3.connect(database)  # what an earlier run left: the demo says so
    earlier.execute("CREATE TABLE shop_order (id integer)")
    earlier.close()
    env = {**os.environ, "EXAMPLE_SQLITE": str(database), "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("EXAMPLE_DB", None)
    out = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=ROOT / "example_project",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Starting from a fresh database: deleted {database} and what it held" in out.stdout
    assert "python3 dev.py demo --keep" in out.stdout
    assert "live jobs left: 0" in out.stdout
    assert "completion markers: 11" in out.stdout  # 8 jobs and 3 Django tasks
    assert "emails sent: 3, cards charged: 3" in out.stdout
    assert "dead letters: 1" in out.stdout
    assert "reason=fatal" in out.stdout
    assert out.stdout.count("SUCCESSFUL Thank you for ordering a") == 3
    # One line per outcome: Django's own per-task INFO lines would double the tasks'.
    assert "state=RUNNING" not in out.stdout + out.stderr
    # Where and with which Python to start the site: commands to paste as they are.
    assert f"  cd {ROOT / 'example_project'}\n" in out.stdout
    assert f"  {sys.executable} manage.py runserver\n" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    find_spec("django.tasks") is None,
    reason="the example project uses django.tasks (Django >= 6.0)",
)
@pytest.mark.parametrize(
    ("command", "passed"),
    [
        (["manage.py", "test", "--noinput"], "Ran 7 tests"),
        (["-m", "pytest", "-q", "-p", "no:cacheprovider"], "9 passed"),
    ],
    ids=["manage.py-test", "pytest"],
)
def test_the_example_projects_own_tests_pass(command, passed, tmp_path):
    """example_project/tests use django_jobs.testing: with Django's runner and with pytest."""
    env = {**os.environ, "EXAMPLE_SQLITE": str(tmp_path / "example.sqlite3")}
    for name in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "EXAMPLE_DB"):
        env.pop(name, None)
    if os.environ.get("TEST_DB", "postgres") != "sqlite":
        # Its own database, next to this run's: the runners make test_<name> and drop it.
        env["EXAMPLE_DB"] = "postgres"
        env["PGDATABASE"] = os.environ.get("JOBS_TEST_DB", "django_jobs") + "_example"
    out = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT / "example_project",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    assert passed in out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    find_spec("django.tasks") is None,
    reason="the example project uses django.tasks (Django >= 6.0)",
)
def test_the_pytest_tests_alone_after_the_demo_run_on_the_test_database(tmp_path):
    """After the demo filled the example's database, its pytest file alone must not see it."""
    env = {**os.environ, "EXAMPLE_SQLITE": str(tmp_path / "example.sqlite3")}
    for name in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "EXAMPLE_DB"):
        env.pop(name, None)
    for command in (
        ["manage.py", "demo"],
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_orders_pytest.py"],
    ):
        out = subprocess.run(
            [sys.executable, *command],
            cwd=ROOT / "example_project",
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    assert "2 passed" in out.stdout
