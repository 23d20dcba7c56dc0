"""Every option of every command: a bad value is a one-line argument error with exit code 2.

Every case goes through manage.py's command-line path (``run_from_argv``); the issue's
cases and a few more run as real processes (``python -m django COMMAND ...``), as an
operator or a cron line runs them. argv may hold bytes that are not UTF-8 (they arrive
as lone surrogates). The argparse types are then driven with generated text
(hypothesis): each returns a value within django_jobs.limits or raises ArgumentTypeError.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import ManagementUtility
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from django_jobs import limits
from django_jobs.management import arguments
from django_jobs.management.commands import replayjobs
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(databases=["default", "other", "jobs2"])

TEN_YEARS = str(limits.MAX_SECONDS)
PAST_TEN_YEARS = str(limits.MAX_SECONDS + 1)
NOT_UTF8 = b"\xff\xfe"  # arrives as '\udcff\udcfe'
BIG = "99999999999999999999"

# Values no number option accepts.
NOT_NUMBERS = ["", " ", "soon", "nan", "NaN", "inf", "-inf", "1e999", "-1e999", "0x10", "1,5"]
HUGE = [BIG, "9" * 5000, "1e13", PAST_TEN_YEARS]

CASES = [
    # runjobs
    *[("runjobs", "--lease", v) for v in [*NOT_NUMBERS, *HUGE, "0", "-1", "-0.5"]],
    *[("runjobs", "--heartbeat", v) for v in [*NOT_NUMBERS, *HUGE, "-1"]],
    *[("runjobs", "--grace", v) for v in [*NOT_NUMBERS, *HUGE, "-1"]],
    *[("runjobs", "--poll-interval", v) for v in [*NOT_NUMBERS, *HUGE, "0", "-1"]],
    *[
        ("runjobs", "--concurrency", v)
        for v in [*NOT_NUMBERS, BIG, "9" * 5000, "0", "-1", "1001", "1.5", "1e3"]
    ],
    *[
        ("runjobs", "--async-concurrency", v)
        for v in [*NOT_NUMBERS, BIG, "0", "-1", "10001", "1.5", "1e3"]
    ],
    *[("runjobs", "--batch", v) for v in [BIG, "2147483648", "0", "-3", "1.5", "nan", ""]],
    *[("runjobs", "--max-jobs", v) for v in [BIG, "2147483648", "0", "1e2", "inf"]],
    *[("runjobs", "--queue", v) for v in ["", "bad queue", "q" * 101, "é", "a\x01b", NOT_UTF8]],
    ("runjobs", "--lease", "5", "--heartbeat", "5"),
    ("runjobs", "--lease", "5", "--heartbeat", TEN_YEARS),
    # replayjobs
    *[
        ("replayjobs", "--dead-after", v)
        for v in [
            "999999999999d",
            "99999999999999999999999w",
            "522w",
            "1e5d",
            "",
            "last week",
            "2024-02-30",
            "2024-13-01",
            "2024-01-01T25:00",
            "0000-01-01",
            "10000-01-01",
            "0001-01-01T00:00+14:00",
            "9999-12-31T23:59-14:00",
            NOT_UTF8,
        ]
    ],
    *[("replayjobs", "--all", "--dead-before", v) for v in ["999999999999d", "2024-02-30"]],
    *[("replayjobs", "--all", "--run-at", v) for v in ["9999999d", "soon", "2024-02-30T10:00"]],
    *[("replayjobs", "--all", "--delay", v) for v in [*NOT_NUMBERS, *HUGE, "-5"]],
    *[("replayjobs", "--all", "--limit", v) for v in [BIG, "9" * 5000, "0", "-1", "1.5", ""]],
    *[("replayjobs", "--reason", v) for v in ["bored", "", NOT_UTF8]],
    *[("replayjobs", "--name", v) for v in ["", "a b", "n" * 201, NOT_UTF8]],
    *[("replayjobs", "--queue", v) for v in ["", "a b", "q" * 101]],
    *[("replayjobs", "--id", v) for v in ["", "42", "g" * 32, NOT_UTF8]],
    *[("replayjobs", "--all", "--by", v) for v in ["b" * 151, "a\x07b", "line\nbreak", NOT_UTF8]],
    ("replayjobs",),
    ("replayjobs", "--dead-after", "1h", "--dead-before", "2h"),
    ("replayjobs", "--all", "--delay", "5", "--run-at", "1h"),
    # prunejobs
    *[
        ("prunejobs", option, v)
        for option in ("--markers", "--dead-letters")
        for v in ["999999999w", "900000000d", "-1d", "soon", "1e5d", "", "nan", BIG + "w", NOT_UTF8]
    ],
    *[("prunejobs", "--batch", v) for v in [BIG, "9" * 5000, "0", "-1", "1.5", "nan"]],
    # jobs and its actions
    ("jobs",),
    ("jobs", "bogus"),
    *[("jobs", "pause", v) for v in ["", "a b", "q" * 101, NOT_UTF8]],
    *[("jobs", "pause", "default", "--reason", v) for v in ["r" * 201, "a\x1bb", NOT_UTF8]],
    *[("jobs", "resume", v) for v in ["", "a b", NOT_UTF8]],
    *[(action, v) for action in ("enable", "disable") for v in ["s" * 101, "a\x01b", NOT_UTF8]],
    *[("jobs", "cancel", v) for v in ["", "42", "not-a-uuid", NOT_UTF8]],
    *[("jobs", "cancel", "--workflow", v) for v in ["", " x", "w" * 256, "a\x01b", NOT_UTF8]],
    ("jobs", "cancel"),
    ("jobs", "cancel", "--workflow", "w", "0191d7b2-0000-7000-8000-000000000000"),
    ("jobs", "status", "--json", "extra"),
]
CASES = [("jobs", *case) if case[0] in ("enable", "disable") else case for case in CASES]


def _label(case):
    return " ".join(a.decode("latin-1") if isinstance(a, bytes) else a for a in case)[:60]


def _one_error_line(stderr):
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error:" in line.lower()]
    assert len(errors) == 1, stderr
    assert len(errors[0]) < 300  # a huge value is cut in the message
    return errors[0]


@pytest.mark.parametrize("argv", CASES, ids=[_label(c) for c in CASES])
def test_bad_values_are_argument_errors_with_exit_code_2(argv, capsys):
    # The command-line path of manage.py (run_from_argv), in this process: argv as
    # Python sees it, bytes that are not UTF-8 decoded to lone surrogates.
    utility = ManagementUtility(["manage.py", *map(os.fsdecode, argv)])
    with pytest.raises(SystemExit) as exit_:
        utility.execute()
    captured = capsys.readouterr()
    assert exit_.value.code == 2, captured.err
    assert captured.out == ""
    _one_error_line(captured.err)


# The cases of the issue, and a few more, as real processes.
PROCESS_CASES = [
    (("runjobs", "--lease", "1e13", "--burst"), "ten years"),
    (("runjobs", "--concurrency", "5000"), "from 1 to 1000"),
    (("runjobs", "--lease", "5", "--heartbeat", "5"), "shorter than the lease"),
    (("replayjobs", "--dead-after", "999999999999d"), "more than ten years"),
    (("replayjobs", "--all", "--run-at", "9999999d"), "more than ten years"),
    (("replayjobs", "--all", "--limit", BIG), "from 1 to 2147483647"),
    (("replayjobs", "--all", "--by", NOT_UTF8), "undecodable"),
    (("replayjobs",), "say which letters"),
    (("prunejobs", "--markers", "999999999w"), "ten years"),
    (("prunejobs", "--markers", "900000000d"), "ten years"),
    (("prunejobs", "--batch", BIG), "from 1 to 2147483647"),
    (("jobs", "pause", "default", "--reason", "a\x1bb"), "control"),
    (("jobs", "cancel", "42"), "not a job id"),
    (("jobs", "cancel", "--workflow", "a\x01b"), "not a valid workflow name"),
    (("jobs", "cancel"), "say what to cancel"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("argv", "message"), PROCESS_CASES, ids=[_label(c) for c, _ in PROCESS_CASES]
)
def test_real_processes_answer_bad_values_with_exit_code_2(argv, message):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    stderr = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 2, stderr
    assert out.stdout == b""
    assert message in _one_error_line(stderr)


def test_the_limits_themselves_are_accepted():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lease", type=arguments.seconds)
    parser.add_argument("--grace", type=arguments.seconds_or_zero)
    parser.add_argument("--batch", type=arguments.positive_int)
    parser.add_argument("--concurrency", type=arguments.threads)
    options = parser.parse_args(
        ["--lease", TEN_YEARS, "--grace", "0", "--batch", "2147483647", "--concurrency", "1000"]
    )
    assert options.lease == limits.MAX_SECONDS
    assert options.grace == 0
    assert options.batch == limits.MAX_INT
    assert options.concurrency == limits.MAX_CONCURRENCY
    assert arguments.duration_or_none("520w") == timedelta(weeks=520)
    assert arguments.duration_or_none("none") is None
    assert replayjobs.when("520w") < datetime.now(UTC) - timedelta(weeks=519)
    assert replayjobs.when("9999-12-31T23:59") == datetime(9999, 12, 31, 23, 59, tzinfo=UTC)


# ---- the argparse types, driven with generated text ---------------------------------------

NUMBERISH = st.from_regex(r"\s*[-+]?\d{0,25}(\.\d{0,6})?([eE][-+]?\d{1,4})?\s*", fullmatch=True)
AGES = st.from_regex(r"\s*\d{1,25}(\.\d{1,4})?\s*[smhdw]?\s*", fullmatch=True)
DATES = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59)).map(
    datetime.isoformat
) | st.dates().map(str)
OFFSETS = st.builds(
    lambda day, sign, hours: f"{day.isoformat()}{sign}{hours:02d}:00",
    st.sampled_from([datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59)]),
    st.sampled_from("+-"),
    st.integers(0, 23),
)
ANY_TEXT = st.text(st.characters(codec=None), max_size=30)  # NUL and lone surrogates too
SPECIAL = st.sampled_from(["nan", "inf", "-inf", "1e999", "", "\x00", "1\x00", "0", "-0", BIG])
TEXTS = ANY_TEXT | NUMBERISH | AGES | DATES | OFFSETS | SPECIAL


def _number_in_range(value, low, high, *, integer):
    if integer:
        return type(value) is int and low <= value <= high
    return type(value) is float and math.isfinite(value) and low <= value <= high


def _within_limits(name, value):
    """Say whether value, returned by the type named name, is one the options may take."""
    if name == "positive_int":
        return _number_in_range(value, 1, limits.MAX_INT, integer=True)
    if name == "threads":
        return _number_in_range(value, 1, limits.MAX_CONCURRENCY, integer=True)
    if name == "seconds":
        return _number_in_range(value, 0, limits.MAX_SECONDS, integer=False) and value > 0
    if name == "seconds_or_zero":
        return _number_in_range(value, 0, limits.MAX_SECONDS, integer=False)
    if name == "duration_or_none":
        return value is None or timedelta(0) <= value <= timedelta(seconds=limits.MAX_SECONDS)
    if name == "when":
        return value.tzinfo is not None and value.astimezone(UTC).year >= 1
    if name == "run_time":
        return limits.EARLIEST_RUN_AT <= value.astimezone(UTC) <= limits.LATEST_RUN_AT
    if name in ("queue_name", "job_name", "reason", "free_text"):
        return isinstance(value, str) and value.isprintable() and len(value) <= 200
    if name == "job_id":
        return isinstance(value, uuid.UUID)
    raise AssertionError(name)


TYPES = {
    "positive_int": arguments.positive_int,
    "threads": arguments.threads,
    "seconds": arguments.seconds,
    "seconds_or_zero": arguments.seconds_or_zero,
    "queue_name": arguments.queue_name,
    "job_name": arguments.job_name,
    "job_id": arguments.job_id,
    "free_text": arguments.free_text(150),
    "duration_or_none": arguments.duration_or_none,
    "when": replayjobs.when,
    "run_time": replayjobs.run_time,
    "reason": replayjobs.reason,
}


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(TYPES)), text=TEXTS)
def test_every_type_returns_a_value_in_range_or_an_argument_error(name, text):
    try:
        value = TYPES[name](text)
    except argparse.ArgumentTypeError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 300
        return
    assert _within_limits(name, value), (name, text, value)
