"""The records of attempts: the error entry constructor, the lease token, and the duration texts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_jobs import limits
from django_jobs.attempts import (
    LEASE_EXPIRED,
    MAX_LABEL,
    MAX_MESSAGE,
    MAX_TRACEBACK,
    error_entry,
    error_summary,
    lease_expired_entry,
    lease_token,
    worker_of,
)

KEYS = {"attempt", "at", "type", "message", "traceback", "worker"}


def test_an_entry_from_an_exception_names_its_type_message_and_traceback():
    try:
        raise KeyError("gone")
    except KeyError as exc:
        entry = error_entry(3, exc=exc, worker="h:1:ab")
    assert entry.keys() == KEYS
    assert (entry["attempt"], entry["type"], entry["worker"]) == (3, "builtins.KeyError", "h:1:ab")
    assert entry["message"] == "'gone'"
    assert "raise KeyError" in entry["traceback"]
    assert error_summary(entry) == "builtins.KeyError: 'gone'"


def test_an_entry_caps_and_cleans_every_text():
    at = datetime(2026, 11, 30, tzinfo=UTC)
    entry = error_entry(
        1, kind="k" * 999, message="m\x00" * 5000, traceback="t" * 99_999, worker="w" * 999, at=at
    )
    assert entry["at"] == at.isoformat()
    assert len(entry["type"]) <= MAX_LABEL + 60 and len(entry["worker"]) <= MAX_LABEL + 60
    assert len(entry["message"]) <= MAX_MESSAGE + 60 and "\x00" not in entry["message"]
    assert len(entry["traceback"]) == MAX_TRACEBACK + 1


def test_an_entry_survives_an_exception_whose_str_raises():
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no")

    entry = error_entry(1, exc=Hostile())
    assert entry["type"].endswith("Hostile") and "str() failed" in entry["message"]


def test_the_lease_expired_entry_names_the_worker_of_the_token():
    entry = lease_expired_entry(4, lease_token("host:2:cd", 7))
    assert (entry["type"], entry["worker"], entry["attempt"]) == (LEASE_EXPIRED, "host:2:cd", 4)
    assert entry.keys() == KEYS


@pytest.mark.parametrize(
    ("token", "worker"), [("h:1:ab#3", "h:1:ab"), ("h:1:ab", "h:1:ab"), ("", ""), ("a#b#c", "a")]
)
def test_worker_of(token, worker):
    assert worker_of(token) == worker


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("12h", 43200), ("90m", 5400), ("45", 45), ("2w", 1209600), ("1.5s", 1.5)],
)
def test_one_duration_parser(text, seconds):
    assert limits.duration(text) == timedelta(seconds=seconds)
    assert limits.duration(seconds) == limits.duration(timedelta(seconds=seconds))
    assert limits.duration("none") is None and limits.duration(None) is None


@pytest.mark.parametrize("value", ["soon", "-3d", "522w", -1, limits.MAX_SECONDS + 1, True, []])
def test_the_duration_parser_refuses_what_is_not_a_duration_up_to_ten_years(value):
    with pytest.raises(ValueError, match="the age"):
        limits.duration(value, what="the age")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (5.9, "5s"),
        (184, "3m 4s"),
        (2520, "42m"),
        (11100, "3h 5m"),
        (187200, "2d 4h"),
        (-90, "1m 30s"),
        (timedelta(days=3), "3d"),
    ],
)
def test_one_duration_formatter(seconds, text):
    assert limits.format_duration(seconds) == text
