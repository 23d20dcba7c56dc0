"""python manage.py replayjobs: filters, dry run, counts, progress, bad input."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobs.management.commands import replayjobs
from django_jobs.models import DeadLetter, DeadReason, Job
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("replayjobs", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def letters():
    now = timezone.now()
    return {
        "fatal-old": DeadLetterFactory(
            name="tests.fatal", reason=DeadReason.FATAL, dead_at=now - timedelta(days=3)
        ),
        "fatal-new": DeadLetterFactory(
            name="tests.fatal", reason=DeadReason.FATAL, dead_at=now - timedelta(minutes=5)
        ),
        "exhausted": DeadLetterFactory(
            reason=DeadReason.ATTEMPTS_EXHAUSTED, queue="emails", dead_at=now - timedelta(hours=5)
        ),
        "replayed": DeadLetterFactory(
            reason=DeadReason.FATAL,
            dead_at=now - timedelta(hours=1),
            replayed_at=now,
            replay_job_id=JobFactory().id,
        ),
    }


def replayed(letters):
    fresh = {x.pk: x for x in DeadLetter.objects.all()}
    return {
        name
        for name, letter in letters.items()
        if fresh[letter.pk].replayed_at and name != "replayed"
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--reason", "fatal"], {"fatal-old", "fatal-new"}),
        (
            ["--reason", "fatal", "--reason", "attempts_exhausted"],
            {"fatal-old", "fatal-new", "exhausted"},
        ),
        (["--name", "tests.fatal"], {"fatal-old", "fatal-new"}),
        (["--queue", "emails"], {"exhausted"}),
        (["--dead-after", "1h"], {"fatal-new"}),
        (["--dead-after", "2d", "--dead-before", "1h"], {"exhausted"}),
        (["--all"], {"fatal-old", "fatal-new", "exhausted"}),
        (["--all", "--limit", "1"], {"fatal-old"}),  # oldest first
    ],
)
def test_filters(letters, args, expected):
    out, _ = run(*args)
    assert replayed(letters) == expected
    assert out.startswith(f"{len(expected)} replayed.")
    assert Job.objects.count() == len(expected) + 1  # + the replayed letter's old job


def test_dead_at_range_with_dates_and_times(letters):
    now = timezone.localtime()
    start = (now - timedelta(days=4)).strftime("%Y-%m-%d")
    end = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S")
    run("--dead-after", start, "--dead-before", end)
    assert replayed(letters) == {"fatal-old"}


def test_dry_run_changes_nothing_and_lists_the_letters(letters):
    out, _ = run("--reason", "fatal", "--dry-run")
    assert (
        out.splitlines()[0] == "Dry run: 2 dead letter(s) would be replayed; nothing was changed."
    )
    assert str(letters["fatal-old"].id) in out and str(letters["fatal-new"].id) in out
    assert str(letters["replayed"].id) not in out
    assert '"label"' not in out  # payloads (and their secrets) are never printed
    assert replayed(letters) == set()
    assert Job.objects.count() == 1


def test_by_id_reports_an_already_replayed_letter(letters):
    out, _ = run(
        "--id", str(letters["replayed"].id), "--id", str(letters["exhausted"].id), "--by", "ops-ann"
    )
    assert out.splitlines()[0] == "1 replayed, 1 already replayed."
    assert f"not replayed (already replayed): {letters['replayed'].id}" in out
    assert DeadLetter.objects.get(pk=letters["exhausted"].pk).replayed_by == "ops-ann"


def test_a_second_run_replays_nothing(letters):
    run("--all")
    out, _ = run("--all")
    assert out.startswith("0 replayed.")
    assert Job.objects.count() == 4


def test_progress_is_shown_for_long_runs(monkeypatch):
    monkeypatch.setattr(replayjobs, "PROGRESS_FROM", 5)
    monkeypatch.setattr("django_jobs.store.replay.REPLAY_BATCH", 4)
    DeadLetterFactory.create_batch(12)
    out, err = run("--all")
    assert out.startswith("12 replayed.")
    lines = err.splitlines()
    assert lines[0] == "replayed 4/12 (33%)" and lines[-1] == "replayed 12/12 (100%)"


def test_short_runs_show_no_progress(letters):
    _, err = run("--all")
    assert err == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say which letters"),
        (["--reason", "bored"], "'bored' is not a reason"),
        (["--dead-after", "last week"], "is not a date"),
        (["--id", "42"], "is not a job id"),
        (["--queue", "no spaces"], "is not a valid queue name"),
        (["--all", "--delay", "-5"], "must be a number of seconds from 0"),
        (["--all", "--limit", "0"], "must be a whole number from 1 to"),
        (["--dead-after", "1h", "--dead-before", "2h"], "--dead-after must be earlier"),
        (["--all", "--delay", "5", "--run-at", "1h"], "not allowed with argument"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(letters, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert replayed(letters) == set()


def test_replay_later(letters):
    run("--reason", "fatal", "--delay", "3600")
    assert Job.objects.scheduled().count() == 2
    tomorrow = (timezone.localtime() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    run("--queue", "emails", "--run-at", tomorrow)
    assert Job.objects.scheduled().count() == 3
