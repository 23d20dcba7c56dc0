"""What runjobs logs at each verbosity: one INFO line per job outcome at -v 1, none at -v 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_jobs import enqueue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _enqueue_three():
    ok = [enqueue("tests.noop", {"i": i}).id for i in range(2)]
    flaky = enqueue("tests.flaky", {"succeed_on": 2}).id
    dead = enqueue("tests.fatal", {}).id
    return ok, flaky, dead


def test_default_verbosity_logs_one_line_per_outcome(worker_process):
    ok, flaky, dead = _enqueue_three()
    proc = worker_process("--burst", "--concurrency", "2")
    assert proc.wait() == 0
    out = proc.output()
    for job_id in ok:
        lines = [line for line in out.splitlines() if str(job_id) in line]
        assert len(lines) == 1, out
        assert re.fullmatch(
            rf"job tests\.noop\[{job_id}\] attempt 1 ran \d+\.\d{{6}}s: succeeded", lines[0]
        )
    assert re.search(rf"job tests\.flaky\[{flaky}\] attempt 1 ran \d+\.\d{{6}}s: retried", out)
    assert re.search(rf"job tests\.flaky\[{flaky}\] attempt 2 ran \d+\.\d{{6}}s: succeeded", out)
    assert f"job tests.fatal[{dead}] attempt 1: dead\n" in out
    assert "Traceback" not in out.split("dead-lettered")[0]
    # The last line counts outcomes; the rare counts (released, fenced out, ...) only when not 0.
    assert re.search(r"stopped: 3 succeeded, 1 retried, 1 dead$", out.strip().splitlines()[-1])


# The log lines the docs quote, as they quote them (whitespace folded): each must be the
# shape of a line a real worker logs.
QUOTED = [
    (
        "docs/quickstart.md",
        "job shop.jobs.send_confirmation[0190…] attempt 1 ran 0.012345s: succeeded",
    ),
    ("docs/worker.md", "job NAME[ID] attempt N ran 0.012345s: succeeded"),
    ("docs/worker.md", "job NAME[ID] attempt N: dead"),
    ("docs/worker.md", "job NAME[ID] attempt 1/8 failed (...); retrying in 1.8s"),
    ("docs/worker.md", "job NAME[ID] dead-lettered (fatal) after 1 attempt(s): ..."),
    ("docs/monitoring.md", "concurrency=4 async_concurrency=100 batch=100 lease=30s"),
    ("docs/monitoring.md", "stopped: 1520 succeeded, 3 retried, 1 dead"),
    (
        "docs/monitoring.md",
        "job shop.jobs.send_confirmation[0190…] attempt 1 ran 0.012345s: succeeded",
    ),
    ("docs/monitoring.md", "job shop.jobs.charge_card[0190…] attempt 2 ran 0.230000s: retried"),
    ("docs/monitoring.md", "job shop.jobs.charge_card[0190…] attempt 5: dead"),
    (
        "docs/monitoring.md",
        "job shop.jobs.charge_card[0190…] attempt 1/8 failed (builtins.ConnectionError: timed out);"
        " retrying in 1.8s",
    ),
    (
        "docs/monitoring.md",
        "job shop.jobs.charge_card[0190…] dead-lettered (fatal) after 1 attempt(s):"
        " django_jobs.exceptions.FatalError: card declined",
    ),
]
_PLACEHOLDERS = re.compile(
    # An exception as the worker names it: "builtins.ConnectionError: timed out".
    r"(?P<error>(?<![\w.])[a-z_.]+\.[A-Z]\w*: [^);]+)"
    r"|(?P<name>[\w.]+(?=\[))|(?P<id>(?<=\[)(?:ID|[0-9a-f]+…)(?=\]))|(?P<any>\.\.\.)"
    r"|(?P<number>(?<![\w.])(?:N|\d+(?:\.\d+)?)(?!\d|\.\d))"
)
_SHAPES = {
    "error": r"[\w.]+\.[A-Z]\w*: .+",
    "name": r"[\w.]+",
    "id": r"[0-9a-f-]{36}",
    "any": r".+",
    "number": r"\d+(?:\.\d+)?",
}


def _shape(quoted: str) -> str:
    """Return a regex for the lines a quoted example stands for (names, ids, numbers vary)."""
    parts, end = [], 0
    for match in _PLACEHOLDERS.finditer(quoted):
        parts += [re.escape(quoted[end : match.start()]), _SHAPES[match.lastgroup]]
        end = match.end()
    return "".join([*parts, re.escape(quoted[end:])])


def test_the_log_lines_the_docs_quote_are_the_ones_a_worker_logs(worker_process):
    _enqueue_three()
    proc = worker_process("--burst", "--concurrency", "2")
    assert proc.wait() == 0
    logged = proc.output().splitlines()
    root = Path(__file__).resolve().parent.parent
    for page, quoted in QUOTED:
        assert quoted in " ".join((root / page).read_text().split()), (
            f"{page} no longer quotes {quoted!r}"
        )
        shape = _shape(quoted)
        assert any(re.search(shape, line) for line in logged), (page, quoted, shape, logged)


def test_verbosity_0_keeps_only_warnings_and_errors(worker_process):
    ok, flaky, dead = _enqueue_three()
    proc = worker_process("--burst", "--concurrency", "2", "-v", "0")
    assert proc.wait() == 0
    out = proc.output()
    assert ": succeeded" not in out
    assert "starting" not in out and "stopped" not in out
    assert not any(str(job_id) in out for job_id in ok)
    # Failures still speak, naming the handler: at -v 0 nothing else says which one failed.
    assert f"job tests.flaky[{flaky}] attempt 1/3 failed" in out
    assert f"job tests.fatal[{dead}] dead-lettered (fatal)" in out


def test_jobs_schedules_names_the_zone_of_every_time(capsys, settings):
    from django.core.management import call_command

    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {
            "nightly": {"cron": "0 3 * * *", "job": "tests.noop", "timezone": "Europe/Paris"},
            "ping": {"every": 30, "job": "tests.noop"},
        },
    }
    call_command("jobs", "schedules")
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    # Shown in the project's zone (UTC here), named, then in the schedule's own zone.
    assert re.search(
        r"\d{4}-\d\d-\d\d 0[12]:00:00 UTC = \d{4}-\d\d-\d\d 03:00:00 Europe/Paris \(in ",
        rows["nightly"],
    ), rows["nightly"]
    assert re.search(r"\d\d:\d\d:\d\d UTC \(in ", rows["ping"]), rows["ping"]
    assert " = " not in rows["ping"]
