"""Run times at the edges of the calendar: refused where they enter, rendered where they are read.

A run time near datetime.min or datetime.max cannot be shown in every time zone
(year 1 in New York is year 0, which Python has not), so every entry point that
takes one holds it to limits.EARLIEST_RUN_AT .. LATEST_RUN_AT, and the admin shows a
row written by hand outside that range instead of answering 500.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone
from importlib.util import find_spec

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone as dj_timezone

from django_jobs import control, enqueue, enqueue_many, enqueue_on_commit, limits, workflow
from django_jobs.exceptions import InvalidJob
from django_jobs.models import BLOCKED_UNTIL, DeadLetter, Job
from tests.admin_fixtures import messages_of, url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory, WorkerBeatFactory
from tests.testapp import jobs as handlers

pytestmark = pytest.mark.django_db

ZONES = ["America/New_York", "Pacific/Kiritimati", "UTC"]
# What the ORM or SQL can write by hand, and no time zone but UTC can show.
OUT_OF_RANGE = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(1, 1, 1, 13, 30, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
]


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("at", OUT_OF_RANGE, ids=lambda at: at.isoformat())
def test_the_admin_shows_a_hand_written_out_of_range_row(admin_client_, settings, zone, at):
    settings.TIME_ZONE = zone
    job = JobFactory(name="tests.edge", run_at=at, enqueued_at=at, started_at=at, attempted_at=at)
    listing = admin_client_.get(url("job_changelist"))
    assert listing.status_code == 200
    assert "tests.edge" in listing.content.decode()
    page = admin_client_.get(url("job_change", job.pk))
    assert page.status_code == 200
    assert at.strftime("%Y-%m-%d") in page.content.decode()


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("at", OUT_OF_RANGE, ids=lambda at: at.isoformat())
def test_the_running_jobs_pages_show_hand_written_out_of_range_times(
    admin_client_, settings, zone, at
):
    settings.TIME_ZONE = zone
    job = JobFactory(
        name="tests.edge",
        leased=True,
        started_at=at,
        attempted_at=at,
        cancel_requested_at=at,
    )
    listing = admin_client_.get(url("runningjob_changelist"))
    assert listing.status_code == 200
    assert "tests.edge" in listing.content.decode()
    page = admin_client_.get(url("runningjob_change", job.pk))
    assert page.status_code == 200
    assert at.strftime("%Y-%m-%d") in page.content.decode()


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("at", OUT_OF_RANGE, ids=lambda at: at.isoformat())
def test_the_letter_marker_and_worker_pages_show_hand_written_out_of_range_times(
    admin_client_, settings, zone, at
):
    settings.TIME_ZONE = zone
    letter = DeadLetterFactory(name="tests.edge", enqueued_at=at, started_at=at, dead_at=at)
    marker = MarkerFactory(name="tests.edge", enqueued_at=at, started_at=at, completed_at=at)
    beat = WorkerBeatFactory(id="edge:1:aa", started_at=at, last_seen_at=at)
    for listing, page in [
        ("deadletter_changelist", url("deadletter_change", letter.pk)),
        ("completionmarker_changelist", url("completionmarker_change", marker.pk)),
        ("workerbeat_changelist", url("workerbeat_change", beat.pk)),
    ]:
        assert admin_client_.get(url(listing)).status_code == 200, listing
        shown = admin_client_.get(page)
        assert shown.status_code == 200, page
        assert at.strftime("%Y-%m-%d") in shown.content.decode(), page


# ---- refused where they enter -------------------------------------------------------------

REFUSED = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(1, 1, 1, 13, tzinfo=UTC) + timedelta(hours=1),
    datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(9000, 1, 1, tzinfo=UTC),  # the sentinel of a blocked step
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
    datetime.max.replace(tzinfo=UTC),
    # Inside the years in its own offset, outside in UTC (and past datetime.max there).
    datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
    datetime(1000, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=14))),
]
ACCEPTED = [limits.EARLIEST_RUN_AT, limits.LATEST_RUN_AT]
MESSAGE = r"run_at must be from 1000-01-01 to 8999-12-31 \(UTC\)"


def _enqueue_with_parent(run_at):
    parent = enqueue(handlers.noop)
    enqueue(handlers.noop, after=[parent], run_at=run_at)


def _workflow(run_at):
    with workflow(name="edges") as w:
        first = w.enqueue(handlers.noop)
        w.enqueue(handlers.noop, after=[first], run_at=run_at)


ENTRY_POINTS = {
    "enqueue": lambda run_at: enqueue(handlers.noop, run_at=run_at),
    "enqueue_on_commit": lambda run_at: enqueue_on_commit(handlers.noop, run_at=run_at),
    "enqueue_many": lambda run_at: enqueue_many(handlers.noop, [1, 2], run_at=run_at),
    "handler.enqueue": lambda run_at: handlers.noop.enqueue(run_at=run_at),
    "after": _enqueue_with_parent,
    "workflow": _workflow,
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("run_at", REFUSED, ids=lambda at: at.isoformat())
def test_enqueue_refuses_run_times_outside_the_years_with_a_clear_error(entry, run_at):
    # The parent of "after" is the caller's own write: it goes with the caller's transaction.
    with pytest.raises(InvalidJob, match=MESSAGE) as error, transaction.atomic():
        ENTRY_POINTS[entry](run_at)
    assert run_at.isoformat() in str(error.value)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_the_edges_themselves_are_stored_and_read_back(entry):
    for run_at in ACCEPTED:
        with transaction.atomic():
            ENTRY_POINTS[entry](run_at)
    # A blocked step keeps its run time as not_before (run_at is the sentinel until release).
    times = {when for row in Job.objects.values_list("not_before", "run_at") for when in row}
    assert set(ACCEPTED) <= times


def test_naive_run_times_are_held_to_the_same_years_without_use_tz(settings):
    settings.USE_TZ = False
    for run_at in (datetime(1, 1, 1), datetime(9999, 12, 31)):  # noqa: DTZ001
        with pytest.raises(InvalidJob, match=MESSAGE):
            enqueue(handlers.noop, run_at=run_at)
    assert Job.objects.count() == 0
    enqueue(handlers.noop, run_at=datetime(1000, 1, 1))  # noqa: DTZ001
    assert Job.objects.get().run_at == datetime(1000, 1, 1)  # noqa: DTZ001


def test_the_limits_hold_every_other_run_time():
    # Delays, snoozes, backoffs and schedule ticks are at most MAX_SECONDS from now.
    assert dj_timezone.now() + timedelta(seconds=limits.MAX_SECONDS) < limits.LATEST_RUN_AT
    assert limits.LATEST_RUN_AT < BLOCKED_UNTIL
    with pytest.raises(ValueError, match="must be a datetime, not str"):
        limits.run_time("run_at", "2026-01-01")


@pytest.mark.skipif(find_spec("django.tasks") is None, reason="django.tasks needs Django >= 6.0")
def test_a_tasks_run_after_is_held_to_the_same_years():
    from django.tasks.exceptions import InvalidTask

    from tests.testapp import tasks

    for run_at in (datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)):
        with pytest.raises(InvalidTask, match=MESSAGE):
            tasks.add.using(run_after=run_at).enqueue(1, 2)
    assert Job.objects.count() == 0


def test_replay_refuses_run_times_outside_the_years():
    letter = DeadLetterFactory()
    with pytest.raises(ValueError, match=MESSAGE):
        control.replay(
            DeadLetter.objects.filter(pk=letter.pk), run_at=datetime(1, 1, 1, tzinfo=UTC)
        )
    letter.refresh_from_db()
    assert letter.replayed_at is None
    assert Job.objects.count() == 0


def test_replayjobs_refuses_a_run_at_outside_the_years():
    DeadLetterFactory()
    with pytest.raises(CommandError, match=r"--run-at must be from 1000-01-01 to 8999-12-31"):
        call_command("replayjobs", "--all", "--run-at", "0001-01-01", stdout=io.StringIO())
    assert Job.objects.count() == 0


def test_the_admins_replay_form_refuses_a_run_at_outside_the_years(admin_client_, settings):
    settings.TIME_ZONE = "America/New_York"
    letter = DeadLetterFactory()
    response = admin_client_.post(
        url("deadletter_replay", letter.pk), {"run_at": "0001-01-01T10:00"}, follow=True
    )
    assert response.status_code == 200
    assert any("from 1000-01-01 to 8999-12-31" in m for m in messages_of(response))
    letter.refresh_from_db()
    assert letter.replayed_at is None
    assert Job.objects.count() == 0
