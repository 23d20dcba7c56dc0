"""`jobs status`, the worker heartbeat table, the Prometheus metrics view, the operations checks."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from django_jobs import control, enqueue, metrics, signals, status
from django_jobs.models import CompletionMarker, DeadLetter, Job, WorkerBeat
from tests.conftest import POSTGRES, wait_for
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "s3cret-token-of-16+chars"


@pytest.fixture
def tables():
    """Known rows in every table status reads, relative to now."""
    now = timezone.now()
    for age in (120, 30, 5):
        JobFactory(queue="default", run_at=now - timedelta(seconds=age))
    JobFactory(queue="default", run_at=now + timedelta(minutes=5))
    JobFactory(queue="default", run_at=now + timedelta(hours=2))
    JobFactory(
        queue="default",
        locked_by="w:1:a#1",
        lease_expires_at=now + timedelta(seconds=30),
        attempts=1,
    )
    JobFactory(queue="emails", run_at=now - timedelta(seconds=10))
    for minutes in (1, 10, 59):
        MarkerFactory(queue="default", completed_at=now - timedelta(minutes=minutes))
    MarkerFactory(queue="emails", completed_at=now - timedelta(minutes=2))
    MarkerFactory(queue="default", completed_at=now - timedelta(minutes=61))
    DeadLetterFactory(queue="default", dead_at=now - timedelta(minutes=3))
    DeadLetterFactory(queue="default", dead_at=now - timedelta(hours=3))
    control.pause(["emails"])
    WorkerBeat.objects.create(id="h:1:aa", host="h", pid=1, queues=["default"], concurrency=4,
                              started_at=now - timedelta(hours=1), last_seen_at=now)  # fmt: skip
    WorkerBeat.objects.create(id="h:2:bb", host="h", pid=2, queues=["default"], concurrency=4,
                              started_at=now - timedelta(hours=1),
                              last_seen_at=now - timedelta(minutes=5))  # fmt: skip
    return now


def _from_tables():
    """The same figures, counted straight from the tables."""
    now = timezone.now()
    hour = now - timedelta(hours=1)
    result = {}
    for queue in ("default", "emails"):
        live = Job.objects.filter(queue=queue)
        result[queue] = {
            "waiting": live.filter(locked_by__isnull=True, run_at__lte=now).count(),
            "scheduled": live.filter(locked_by__isnull=True, run_at__gt=now).count(),
            "running": live.filter(locked_by__isnull=False).count(),
            "done_last_hour": CompletionMarker.objects.filter(
                queue=queue, completed_at__gte=hour
            ).count(),
            "dead_last_hour": DeadLetter.objects.filter(queue=queue, dead_at__gte=hour).count(),
        }
    return result


def test_status_figures_equal_what_the_tables_hold(tables):
    report = status.status()
    by_name = {q.name: q for q in report.queues}
    expected = _from_tables()
    assert expected["default"] == {
        "waiting": 3,
        "scheduled": 2,
        "running": 1,
        "done_last_hour": 3,
        "dead_last_hour": 1,
    }
    for name, figures in expected.items():
        got = by_name[name]
        assert {k: getattr(got, k) for k in figures} == figures
    assert by_name["emails"].paused and not by_name["default"].paused
    assert 115 <= by_name["default"].oldest_wait <= 130
    assert 5 <= by_name["emails"].oldest_wait <= 20
    assert [w.id for w in report.workers] == ["h:1:aa"]  # the other one's heartbeat is stale


def test_status_command_prints_the_figures(tables, capsys):
    call_command("jobs", "status")
    out = capsys.readouterr().out
    header, default, emails = out.splitlines()[:3]
    assert header.split()[:5] == ["queue", "state", "waiting", "scheduled", "running"]
    assert default.split()[0] == "default" and default.split()[1:4] == ["3", "2", "1"]
    assert default.split()[-2:] == ["3", "1"]
    assert emails.split()[:2] == ["emails", "PAUSED"]
    assert "1 live worker(s)" in out and "h " in out
    call_command("jobs", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    default = next(q for q in data["queues"] if q["name"] == "default")
    assert {
        k: default[k]
        for k in ("waiting", "scheduled", "running", "done_last_hour", "dead_last_hour")
    } == (_from_tables()["default"])
    assert [w["pid"] for w in data["workers"]] == [1]


@pytest.mark.slow
def test_live_workers_come_from_the_heartbeat_rows_of_real_workers(worker_process, capsys):
    env = {"JOBS_TEST_SETTINGS": json.dumps({"MAINTENANCE_INTERVAL": 0.3, "WORKER_EXPIRY": 5})}
    a = worker_process("--concurrency", "3", "--queue", "default", extra_env=env)
    b = worker_process("--concurrency", "1", "--queue", "emails", extra_env=env)
    wait_for(lambda: WorkerBeat.objects.count() == 2, message="both heartbeat rows")
    enqueue(jobs.record, {"label": "seen"})
    wait_for(lambda: CompletionMarker.objects.exists(), message="the job")
    workers = {w.pid: w for w in status.live_workers()}
    assert set(workers) == {a.pid, b.pid}
    assert (workers[a.pid].queues, workers[a.pid].concurrency) == (["default"], 3)
    assert (workers[b.pid].queues, workers[b.pid].concurrency) == (["emails"], 1)
    assert workers[a.pid].host == os.uname().nodename
    wait_for(
        lambda: WorkerBeat.objects.get(pid=a.pid).stats.get("outcomes", {}).get("succeeded") == 1,
        message="the counters in the heartbeat row",
    )
    call_command("jobs", "status")
    assert "2 live worker(s)" in capsys.readouterr().out
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=20) == 0
    assert [w.pid for w in status.live_workers()] == [b.pid]  # a clean exit removes its row
    b.signal(signal.SIGTERM)
    assert b.wait(timeout=20) == 0


# ---- metrics -------------------------------------------------------------------------------------


def _staff():
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def test_metrics_need_a_token_or_a_staff_user(tables):
    assert Client().get("/metrics/jobs").status_code == 403
    with override_settings(DJANGO_JOBS={"METRICS_TOKEN": TOKEN}):
        assert (
            Client().get("/metrics/jobs", headers={"Authorization": "Bearer wrong"}).status_code
            == 403
        )
        response = Client().get("/metrics/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert _staff().get("/metrics/jobs").status_code == 200


def test_metrics_expose_queue_gauges_from_the_tables(tables):
    body = _staff().get("/metrics/jobs").content.decode()
    assert 'django_jobs_queue_jobs{queue="default",state="waiting"} 3.0' in body
    assert 'django_jobs_queue_jobs{queue="default",state="scheduled"} 2.0' in body
    assert 'django_jobs_queue_jobs{queue="default",state="running"} 1.0' in body
    assert 'django_jobs_queue_paused{queue="emails"} 1.0' in body
    assert 'django_jobs_queue_done_last_hour{queue="default"} 3.0' in body
    assert 'django_jobs_queue_dead_last_hour{queue="default"} 1.0' in body
    assert 'django_jobs_queue_oldest_wait_seconds{queue="default"} 1' in body  # 1xx seconds
    assert "django_jobs_workers 1.0" in body


def test_metrics_expose_worker_counters_and_durations(run_worker):
    for i in range(3):
        enqueue(jobs.record, {"label": f"m{i}"})
    enqueue(jobs.snoozer, {"times": 1})
    enqueue(jobs.fatal, {})
    worker = run_worker()
    snapshot = worker._ops.snapshot()
    assert snapshot["started"] == 6  # 3 + the snoozer twice + the fatal one
    assert snapshot["outcomes"] == {"succeeded": 4, "snoozed": 1, "dead": 1}
    assert (
        sum(snapshot["duration_buckets"]) == 5
    )  # a dead letter's job_finished carries no duration
    now = timezone.now()
    WorkerBeat.objects.create(id="h:9:cc", host="h", pid=9, queues=["default"], concurrency=2,
                              started_at=now, last_seen_at=now, stats=snapshot)  # fmt: skip
    body = _staff().get("/metrics/jobs").content.decode()
    assert (
        'django_jobs_jobs_finished_total{host="h",outcome="succeeded",worker="h:9:cc"} 4.0' in body
    )
    assert 'django_jobs_jobs_finished_total{host="h",outcome="snoozed",worker="h:9:cc"} 1.0' in body
    assert 'django_jobs_jobs_finished_total{host="h",outcome="dead",worker="h:9:cc"} 1.0' in body
    assert 'django_jobs_jobs_started_total{host="h",worker="h:9:cc"} 6.0' in body
    assert 'django_jobs_reexecutions_total{host="h",kind="rescued",worker="h:9:cc"} 0.0' in body
    assert 'django_jobs_job_duration_seconds_count{host="h",worker="h:9:cc"} 5.0' in body
    assert 'django_jobs_job_duration_seconds_bucket{host="h",le="+Inf",worker="h:9:cc"} 5.0' in body


def test_enqueue_counter_of_this_process():
    metrics.install()
    try:
        enqueue(jobs.record, {"label": "counted"})
        enqueue(jobs.record, {"label": "dup"}, key="k1")
        enqueue(jobs.record, {"label": "dup"}, key="k1")  # a duplicate is not an enqueue
        body = _staff().get("/metrics/jobs").content.decode()
        line = next(
            x
            for x in body.splitlines()
            if x.startswith('django_jobs_enqueued_total{queue="default"}')
        )
        assert float(line.split()[-1]) >= 2.0
    finally:
        signals.job_enqueued.disconnect(dispatch_uid="django_jobs.metrics.enqueued")


# ---- checks --------------------------------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize(
    ("settings", "check_id"),
    [
        ({"KEEP_MARKERS": "soon"}, "django_jobs.E203"),
        ({"KEEP_DEAD_LETTERS": -1}, "django_jobs.E203"),
        ({"PRUNE_BATCH": 0}, "django_jobs.E204"),
        ({"MAINTENANCE_INTERVAL": 0}, "django_jobs.E205"),
        ({"MAINTENANCE_INTERVAL": 30, "WORKER_EXPIRY": 40}, "django_jobs.E206"),
        ({"METRICS_TOKEN": "short"}, "django_jobs.E209"),
    ],
)
def test_checks_report_bad_operations_settings(settings, check_id):
    with override_settings(DJANGO_JOBS=settings):
        assert check_id in {m.id for m in run_checks()}


@pytest.mark.postgres
def test_autovacuum_check_follows_the_server_setting():
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        on = cursor.fetchone()[0] == "on"
    ids = {m.id for m in run_checks(databases=["default"])}
    assert ("django_jobs.W201" in ids) is (not on)


def test_postgres_flag_matches_the_database():
    assert POSTGRES is (connection.vendor == "postgresql")
