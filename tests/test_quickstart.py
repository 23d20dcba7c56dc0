"""The Quickstart (docs/quickstart.md), copied top to bottom into a fresh startproject.

Then docs/celery.md's examples and docs/testing.md's tests, in the same project.

Each code block of the page follows an HTML comment that says what to do with it:
`<!-- quickstart: run -->` (shell commands, run one by one), `write PATH` (the whole
file), `append PATH`, `postgres append PATH` (only on PostgreSQL), `output` (what the
last command printed, spaces aside) and `skip ...`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, throwaway_postgres_database

BLOCK = re.compile(r"<!-- quickstart: ([^>]*?) -->\n```(\w+)\n(.*?)\n```\n", re.DOTALL)


@dataclass(frozen=True)
class Step:
    action: str  # run, write, append, output, skip
    path: str | None
    code: str
    postgres_only: bool


def steps(page: Path, *, every_block: bool) -> list[Step]:
    """Return the marked code blocks of page, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for marker, _language, code in BLOCK.findall(text):
        words = marker.split()
        postgres_only = words[0] == "postgres"
        if postgres_only:
            words = words[1:]
        action, *rest = words
        assert action in ("run", "write", "append", "output", "skip"), marker
        path = rest[0] if action in ("write", "append") else None
        found.append(Step(action, path, code + "\n", postgres_only))
    if every_block:  # none is left out of the run silently
        assert len(found) == text.count("\n```") // 2, f"a code block of {page} has no marker"
    return found


def command(line: str) -> list[str]:
    """Return the argv of a documented command, run with the interpreter of the tests."""
    argv = shlex.split(line, comments=True)
    if argv[0] == "django-admin":
        return [sys.executable, "-m", "django", *argv[1:]]
    assert argv[0] == "python", line
    return [sys.executable, *argv[1:]]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request):
    """Yield the engine and, on PostgreSQL, a database of its own, dropped afterwards."""
    if request.param == "sqlite":
        yield "sqlite", None
        return
    name = f"{os.environ.get('JOBS_TEST_DB', 'django_jobs')}_quickstart_{uuid.uuid4().hex[:8]}"
    # And the test database of testing.md's run, should that run have died.
    with throwaway_postgres_database(name, also_drop=[f"test_{name}"]):
        yield "postgres", name


def follow(
    page: Path, cwd: Path, engine: str, database: str | None, *, every_block: bool = True
) -> dict[str, str]:
    """Do what page says in cwd; return each command's output (stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    outputs: dict[str, str] = {}
    last = ""
    for step in steps(page, every_block=every_block):
        if step.action == "skip" or (step.postgres_only and engine != "postgres"):
            continue
        if step.action == "run":
            for line in step.code.splitlines():
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                argv = shlex.split(line, comments=True)
                if argv[0] == "cd":
                    cwd = cwd / argv[1]
                    continue
                done = subprocess.run(
                    command(line), cwd=cwd, env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                last = outputs[" ".join(argv)] = done.stdout + done.stderr
            continue
        if step.action == "output":
            printed = {" ".join(line.split()) for line in last.splitlines()}
            shown = [" ".join(line.split()) for line in step.code.splitlines()]
            assert [line for line in shown if line not in printed] == [], last
            continue
        code = step.code
        if step.postgres_only:
            # The page's database name and host, for this test's own database and server.
            code = code.replace('"mysite"', repr(database))
            code = code.replace('"127.0.0.1"', repr(os.environ.get("PGHOST", "127.0.0.1")))
            code = code.replace('"postgres"', repr(os.environ.get("PGUSER", "postgres")))
        target = cwd / step.path
        if step.action == "write":
            target.write_text(code, encoding="utf-8")
        else:
            with target.open("a", encoding="utf-8") as file:
                file.write("\n" + code)
    outputs["cwd"] = str(cwd)
    return outputs


@pytest.mark.slow
def test_the_quickstart_runs_in_a_fresh_project(tmp_path, engine):
    vendor, database = engine
    out = follow(ROOT / "docs" / "quickstart.md", tmp_path, vendor, database)
    project = Path(out["cwd"])
    assert (project / "shop" / "migrations" / "0001_initial.py").exists()
    placed = next(v for k, v in out.items() if k.startswith("python manage.py shell"))
    assert "order 1 placed" in placed
    ran = out["python manage.py runjobs --burst"]
    assert "job shop.jobs.send_confirmation[" in ran
    assert "job shop.jobs.charge_card[" in ran
    assert ran.count("attempt 1 ran") == 2
    assert ran.count(": succeeded") == 2
    status = out["python manage.py jobs status"]
    default = next(line for line in status.splitlines() if line.startswith("default"))
    assert default.split()[1:] == ["0", "0", "0", "0", "-", "2", "0"], status
    # What the jobs did: one email for the order, and the order charged.
    check = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-v",
            "0",
            "-c",
            "from shop.models import Email, Order; o = Order.objects.get();"
            " print(o.charged, [e.subject for e in Email.objects.filter(order=o)])",
        ],
        cwd=project,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert check.stdout.strip() == "True ['Your book is on its way']"
    if vendor == "postgres":
        assert "postgresql" in (project / "mysite" / "settings.py").read_text()

    # docs/celery.md's examples continue the same project.
    celery = follow(ROOT / "docs" / "celery.md", project, vendor, database)
    ran = celery["python manage.py runjobs --burst"]
    # One refresh now and the workflow's three steps (tidy's 5-minute tick may come too).
    done = [line for line in ran.splitlines() if line.endswith(": succeeded")]
    assert len([line for line in done if "job shop.jobs.refresh_stock[" in line]) == 3, ran
    assert len([line for line in done if "job shop.jobs.summarize[" in line]) == 1, ran

    # docs/testing.md's examples are tests of this same app, and pass in it.
    tested = follow(ROOT / "docs" / "testing.md", project, vendor, database, every_block=False)
    ran = tested["python manage.py test shop"]
    assert "Ran 2 tests" in ran, ran
    assert "\nOK" in ran, ran
    assert " 1 passed" in tested["python -m pytest --ds=mysite.settings shop/test_orders.py"]

    # docs/monitoring.md's signal receiver, in the same app, for an order that cannot succeed.
    follow(ROOT / "docs" / "monitoring.md", project, vendor, database, every_block=False)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    post = "from django.test import Client; Client(SERVER_NAME='localhost').post('/orders/',"
    post += " {'email': 'ada@example.com', 'item': 'discontinued'})"
    for argv in (["shell", "-v", "0", "-c", post], ["runjobs", "--burst"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    printed = re.findall(
        r"^job shop\.jobs\.charge_card\[[0-9a-f-]{36}\] dead-lettered: .*$", done.stdout, re.M
    )
    assert printed, done.stdout + done.stderr
    page = " ".join((ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8").split())
    shown = re.sub(r"\[[0-9a-f-]{36}\]", "[0190…]", printed[0])
    assert f"`{shown}`" in page, (shown, printed)


GUIDES = ["quickstart.md", "celery.md", "deployment.md", "faq.md"]
# What the guides pass to other commands: pip, pip wheel, systemctl, `jobs status`.
OTHER_COMMANDS_OPTIONS = {"--no-cache-dir", "--no-deps", "--now", "--json"}


@pytest.mark.parametrize("page", GUIDES)
def test_every_option_a_guide_names_is_a_runjobs_option(page):
    from django_jobs.management.commands.runjobs import Command

    parser = Command().create_parser("manage.py", "runjobs")
    options = {option for action in parser._actions for option in action.option_strings}
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w-])--[a-z][-a-z]*", text)) - OTHER_COMMANDS_OPTIONS
    assert sorted(named - options) == []


def test_the_readme_example_is_the_quickstarts_code():
    """Every statement of the README's first example is a line of the Quickstart."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme[readme.index("```python\n") + 10 :].split("\n```", 1)[0]
    quickstart = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    lines = {line.split("  #")[0].strip() for line in quickstart.splitlines()}
    statements = [
        line.split("  #")[0].strip()
        for line in example.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "from ", "import "))
    ]
    assert len(statements) > 8
    assert [s for s in statements if s not in lines] == []
