"""Periodic jobs: cron and interval ticks, exactly one job per tick across workers, missed ticks."""

from __future__ import annotations

import json
import logging
import signal
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_jobs import periodic, schedules
from django_jobs.models import CompletionMarker, Job, Schedule, WorkerBeat
from django_jobs.schedules import InvalidSchedule, make_spec
from django_jobs.worker.ticker import Ticker, db_now, sync
from tests.conftest import wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit

BASE = {
    "BACKOFF": {"kind": "fixed", "base": 0.0, "ceiling": 0.0, "jitter": 0.0},
    "POLL_INTERVAL": 0.2,
}
PARIS = ZoneInfo("Europe/Paris")


def jobs_settings(**extra):
    return override_settings(DJANGO_JOBS={**BASE, **extra})


# ---- ticks -----------------------------------------------------------------------------


def test_cron_ticks_follow_the_schedules_timezone():
    spec = make_spec("nine", job="tests.noop", cron="0 9 * * *", timezone="America/New_York")
    winter = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
    summer = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
    assert spec.next_tick(winter) == datetime(2026, 1, 15, 14, 0, tzinfo=UTC)  # 9:00 EST
    assert spec.next_tick(summer) == datetime(2026, 7, 15, 13, 0, tzinfo=UTC)  # 9:00 EDT
    assert spec.previous_tick(winter) == datetime(2026, 1, 14, 14, 0, tzinfo=UTC)


def test_previous_tick_includes_now_and_next_tick_excludes_it():
    spec = make_spec("five", job="tests.noop", cron="*/5 * * * *")
    on_tick = datetime(2026, 5, 1, 10, 5, tzinfo=UTC)
    assert spec.previous_tick(on_tick) == on_tick
    assert spec.next_tick(on_tick) == on_tick + timedelta(minutes=5)
    assert spec.previous_tick(on_tick + timedelta(seconds=299)) == on_tick


def test_a_tick_in_the_hour_that_dst_skips_runs_once_after_the_jump():
    # 2026-03-29 in Paris: 02:00 local jumps to 03:00. Debian cron (and cronsim) run 02:30 at 03:00.
    spec = make_spec("half-two", job="tests.noop", cron="30 2 * * *", timezone="Europe/Paris")
    tick = spec.next_tick(datetime(2026, 3, 28, 12, 0, tzinfo=PARIS))
    assert tick.astimezone(PARIS) == datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)
    assert spec.next_tick(tick) == datetime(2026, 3, 30, 2, 30, tzinfo=PARIS).astimezone(UTC)


def test_interval_ticks_are_aligned_on_the_epoch():
    spec = make_spec("tens", job="tests.noop", every=10)
    at = datetime(2026, 5, 1, 10, 0, 7, 500_000, tzinfo=UTC)
    assert spec.previous_tick(at) == datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
    assert spec.next_tick(at) == datetime(2026, 5, 1, 10, 0, 10, tzinfo=UTC)
    assert spec.key(spec.previous_tick(at)) == "schedule:tens:2026-05-01T10:00:00Z"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * * * * *"}, "five-field"),
        ({"cron": "@daily"}, "five-field"),
        ({"cron": "* * * * *", "every": 60}, "either a cron expression or every"),
        ({}, "either a cron expression or every"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"every": 0}, "whole number of seconds"),
        ({"every": 1.5}, "whole number of seconds"),
        ({"every": True}, "whole number of seconds"),
        ({"cron": "* * * * *", "payload": {1, 2}}, "not JSON"),
        ({"cron": "* * * * *", "queue": "bad queue"}, "invalid queue"),
        ({"cron": "* * * * *", "priority": 500}, "priority"),
    ],
)
def test_invalid_definitions_are_refused_with_the_reason(options, message):
    with pytest.raises(InvalidSchedule, match=message):
        make_spec("bad", job="tests.noop", **options)


def test_periodic_goes_above_job():
    with pytest.raises(TypeError, match="above @job"):
        periodic("* * * * *")(lambda payload, ctx: None)


def test_periodic_declares_a_schedule_named_after_the_job():
    try:
        periodic("0 3 * * *", timezone="Europe/Paris", payload={"kind": "nightly"})(jobs.record_key)
        spec = schedules.declared()["tests.record_key"]
        assert (spec.job, spec.cron, spec.timezone, spec.payload) == (
            "tests.record_key",
            "0 3 * * *",
            "Europe/Paris",
            '{"kind":"nightly"}',
        )
        with pytest.raises(InvalidSchedule, match="declared twice"):
            periodic("0 4 * * *")(jobs.record_key)
    finally:
        schedules.undeclare("tests.record_key")


@pytest.mark.django_db(databases=["default", "other", "jobs2"])  # model checks: SQLite JSON1
@pytest.mark.parametrize(
    ("schedules_setting", "check_id"),
    [
        ({"x": {"cron": "nope", "job": "tests.noop"}}, "django_jobs.E201"),
        ({"x": {"cron": "* * * * *"}}, "django_jobs.E201"),
        ({"x": {"cron": "* * * * *", "job": "tests.noop", "colour": "red"}}, "django_jobs.E201"),
        ({"x": {"cron": "* * * * *", "job": "tests.not_registered"}}, "django_jobs.E202"),
    ],
)
def test_checks_report_bad_schedules(schedules_setting, check_id):
    with jobs_settings(SCHEDULES=schedules_setting):
        assert check_id in {m.id for m in run_checks()}


@pytest.mark.django_db(databases=["default", "other", "jobs2"])  # model checks: SQLite JSON1
def test_a_misspelt_schedule_job_gets_a_did_you_mean():
    with jobs_settings(SCHEDULES={"x": {"cron": "* * * * *", "job": "tests.recrod"}}):
        found = [m for m in run_checks() if m.id == "django_jobs.E202"]
    assert len(found) == 1
    assert found[0].hint.startswith("Did you mean 'tests.record'? Use the handler's name")


# ---- the database side ---------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


def _now():
    return db_now("default")


@pytestmark_db
def test_sync_writes_definitions_and_keeps_the_database_state():
    with jobs_settings(SCHEDULES={"tick": {"every": 60, "job": "tests.record_key"}}):
        sync()
    row = Schedule.objects.get()
    assert (row.name, row.every, row.cron, row.job_name, row.enabled, row.declared) == (
        "tick",
        60,
        "",
        "tests.record_key",
        True,
        True,
    )
    Schedule.objects.all().disable()
    Schedule.objects.filter(name="tick").update(last_tick_at=_now())
    with jobs_settings(
        SCHEDULES={"tick": {"cron": "0 * * * *", "job": "tests.record_key", "payload": [1]}}
    ):
        sync()
    row.refresh_from_db()
    assert (row.cron, row.every, row.payload, row.enabled) == ("0 * * * *", None, "[1]", False)
    assert row.last_tick_at is not None
    with jobs_settings(SCHEDULES={}):
        sync()
    row.refresh_from_db()
    assert row.declared is False


@pytestmark_db
def test_two_tickers_enqueue_a_tick_once():
    with jobs_settings(SCHEDULES={"tick": {"every": 60, "job": "tests.record_key"}}):
        sync()
        # The schedule has existed for a while and handled a tick two minutes ago.
        now = _now()
        Schedule.objects.update(
            created_at=now - timedelta(hours=1), last_tick_at=now - timedelta(minutes=2)
        )
        a, b = Ticker("default"), Ticker("default")
        a.refresh(now)
        b.refresh(now)
        assert a.run_due(now) == 1
        assert b.run_due(now) == 0  # the compare-and-set on the schedule row refused it
        assert a.run_due(now) == 0
    tick = make_spec("tick", job="tests.record_key", every=60).previous_tick(now)
    job = Job.objects.get()
    assert job.key == f"schedule:tick:{tick:%Y-%m-%dT%H:%M:%SZ}"
    assert job.run_at == tick and job.name == "tests.record_key"
    row = Schedule.objects.get()
    assert (row.last_tick_at, row.last_job_id) == (tick, job.id)


@pytestmark_db
def test_missed_ticks_run_once_the_latest_only(caplog):
    with jobs_settings(SCHEDULES={"minutely": {"cron": "* * * * *", "job": "tests.record_key"}}):
        sync()
        now = _now()
        # The workers were down for ten minutes.
        Schedule.objects.update(
            created_at=now - timedelta(hours=1), last_tick_at=now - timedelta(minutes=10)
        )
        ticker = Ticker("default")
        ticker.refresh(now)
        with caplog.at_level(logging.INFO, logger="django_jobs.schedules"):
            assert ticker.run_due(now) == 1
        assert ticker.run_due(now) == 0
    latest = now.replace(second=0, microsecond=0)
    assert list(Job.objects.values_list("key", flat=True)) == [
        f"schedule:minutely:{latest:%Y-%m-%dT%H:%M:%SZ}"
    ]
    assert "9 earlier missed tick(s) skipped" in caplog.text


@pytestmark_db
def test_a_new_schedule_does_not_run_the_tick_before_it_existed():
    with jobs_settings(SCHEDULES={"yearly": {"cron": "0 0 1 1 *", "job": "tests.record_key"}}):
        sync()
        ticker = Ticker("default")
        now = _now()
        ticker.refresh(now)
        assert ticker.run_due(now) == 0
        assert ticker.next_due == make_spec("y", job="x", cron="0 0 1 1 *").next_tick(now)
    assert Job.objects.count() == 0


@pytestmark_db
def test_disabled_schedules_do_not_tick_and_enabling_skips_what_was_missed():
    with jobs_settings(SCHEDULES={"tick": {"every": 60, "job": "tests.record_key"}}):
        sync()
        now = _now()
        Schedule.objects.update(
            created_at=now - timedelta(hours=1), last_tick_at=now - timedelta(minutes=5)
        )
        Schedule.objects.all().disable()
        ticker = Ticker("default")
        ticker.refresh(now)
        assert ticker.run_due(now) == 0
        Schedule.objects.all().enable()
        now = _now()
        ticker.refresh(now)
        assert ticker.run_due(now) == 0  # ticks missed while disabled are not run
        assert Schedule.objects.get().last_tick_at >= now - timedelta(seconds=5)
    assert Job.objects.count() == 0


@pytestmark_db
def test_jobs_command_lists_enables_and_disables_schedules(capsys):
    with jobs_settings(
        SCHEDULES={
            "nightly": {"cron": "0 3 * * *", "job": "tests.record_key", "timezone": "Europe/Paris"}
        }
    ):
        call_command("jobs", "schedules")
        out = capsys.readouterr().out
        assert "nightly" in out and "0 3 * * * (Europe/Paris)" in out and "enabled" in out
        call_command("jobs", "disable", "nightly")
        assert Schedule.objects.get().enabled is False
        call_command("jobs", "schedules")
        assert "disabled" in capsys.readouterr().out
        call_command("jobs", "enable", "nightly")
        assert Schedule.objects.get().enabled is True
        with pytest.raises(CommandError, match="no schedule named 'nope'"):
            call_command("jobs", "disable", "nope")


# ---- real worker processes ---------------------------------------------------------------------


def _ticks(name):
    labels = Audit.objects.filter(label__startswith=f"schedule:{name}:").values_list(
        "label", flat=True
    )
    return [datetime.strptime(label.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for label in labels]


@pytest.mark.slow
@pytestmark_db
def test_two_workers_one_schedule_exactly_one_job_per_tick(worker_process):
    env = {
        "JOBS_TEST_SETTINGS": json.dumps(
            {
                "SCHEDULES": {"every-second": {"every": 1, "job": "tests.record_key"}},
                "MAINTENANCE_INTERVAL": 0.5,
                "WORKER_EXPIRY": 5,
            }
        )
    }
    workers = [worker_process("--concurrency", "2", extra_env=env) for _ in range(2)]
    wait_for(
        lambda: Audit.objects.filter(label__startswith="schedule:").count() >= 6,
        timeout=40,
        message="six ticks to run",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait(timeout=20) for w in workers] == [0, 0], [w.output()[-2000:] for w in workers]
    ticks = sorted(_ticks("every-second"))
    assert len(ticks) >= 6
    assert len(ticks) == len(set(ticks)), "a tick ran twice"
    gaps = {(b - a).total_seconds() for a, b in zip(ticks, ticks[1:], strict=False)}
    assert gaps == {1.0}, f"ticks were skipped while both workers were up: {ticks}"
    keys = list(
        CompletionMarker.objects.filter(name="tests.record_key").values_list("key", flat=True)
    )
    assert len(keys) == len(set(keys)) >= len(ticks) - 1
    assert (
        Job.objects.filter(
            name="tests.record_key", run_at__lte=ticks[-1].replace(tzinfo=UTC)
        ).count()
        == 0
    )


@pytest.mark.slow
@pytestmark_db
def test_cron_schedule_after_downtime_enqueues_the_latest_tick_once_across_workers(worker_process):
    env = {
        "JOBS_TEST_SETTINGS": json.dumps(
            {
                "SCHEDULES": {"minutely": {"cron": "* * * * *", "job": "tests.record_key"}},
                "MAINTENANCE_INTERVAL": 0.3,
                "WORKER_EXPIRY": 5,
            }
        )
    }
    with jobs_settings(SCHEDULES={"minutely": {"cron": "* * * * *", "job": "tests.record_key"}}):
        sync()
    now = _now()
    Schedule.objects.update(
        created_at=now - timedelta(hours=2), last_tick_at=now - timedelta(hours=1)
    )
    workers = [worker_process("--concurrency", "1", extra_env=env) for _ in range(2)]
    wait_for(lambda: WorkerBeat.objects.count() == 2, message="both workers to beat")
    wait_for(
        lambda: Audit.objects.filter(label__startswith="schedule:minutely:").exists(),
        message="the tick",
    )
    row = Schedule.objects.get()
    before_next = row.last_tick_at + timedelta(minutes=1)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait(timeout=20) for w in workers] == [0, 0]
    labels = list(
        Audit.objects.filter(label__startswith="schedule:minutely:").values_list("label", flat=True)
    )
    if _now() < before_next:  # no new minute began meanwhile: exactly one job, the latest tick
        assert labels == [f"schedule:minutely:{row.last_tick_at:%Y-%m-%dT%H:%M:%SZ}"]
    assert len(labels) == len(set(labels)) <= 2
    assert WorkerBeat.objects.count() == 0  # clean exits remove their rows
