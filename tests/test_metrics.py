"""The Prometheus metrics view: access, queue gauges, worker counters, hand-edited stats."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from django_jobs import enqueue, metrics, signals
from django_jobs.models import WorkerBeat
from tests.factories import WorkerBeatFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db

pytest.importorskip("prometheus_client")

TOKEN = "s3cret-token-of-16+chars"


@pytest.fixture
def staff(login):
    """A logged-in staff user with one django_jobs permission (as the dashboard asks)."""
    return login("view_job")


def scrape(client) -> str:
    response = client.get("/metrics/jobs")
    assert response.status_code == 200
    return response.content.decode()


# ---- access and figures --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_metrics_need_a_token_or_a_staff_user(status_rows, staff):
    assert Client().get("/metrics/jobs").status_code == 403
    with override_settings(DJANGO_JOBS={"METRICS_TOKEN": TOKEN}):
        wrong = Client().get("/metrics/jobs", headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 403
        response = Client().get("/metrics/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert staff.get("/metrics/jobs").status_code == 200


@pytest.mark.parametrize(
    ("who", "sees"),
    [
        ({}, False),  # staff, no django_jobs permission
        ({"staff": False, "superuser": False}, False),
        ({"codenames": ["view_deadletter"]}, True),
        ({"codenames": ["replay_deadletter"]}, True),
        ({"superuser": True}, True),
        ({"staff": False, "codenames": ["view_job"]}, False),
    ],
)
def test_the_metrics_and_the_dashboard_have_one_permission_rule(login, who, sees):
    client = login(
        *who.get("codenames", ()),
        superuser=who.get("superuser", False),
        staff=who.get("staff", True),
    )
    metrics = client.get("/metrics/jobs")
    dashboard = client.get(reverse("admin:django_jobs_dashboard"))
    assert metrics.status_code == (200 if sees else 403)
    # The admin sends a user who is not staff to its login page, and refuses staff without
    # a django_jobs permission.
    assert dashboard.status_code == (200 if sees else 302 if not who.get("staff", True) else 403)


@pytest.mark.django_db(transaction=True)
def test_metrics_expose_queue_gauges_from_the_tables(status_rows, staff):
    body = scrape(staff)
    assert 'django_jobs_queue_jobs{queue="default",state="waiting"} 3.0' in body
    assert 'django_jobs_queue_jobs{queue="default",state="scheduled"} 2.0' in body
    assert 'django_jobs_queue_jobs{queue="default",state="running"} 1.0' in body
    assert 'django_jobs_queue_jobs{queue="default",state="blocked"} 0.0' in body
    assert 'django_jobs_queue_paused{queue="emails"} 1.0' in body
    assert 'django_jobs_queue_done_last_hour{queue="default"} 3.0' in body
    assert 'django_jobs_queue_dead_last_hour{queue="default"} 1.0' in body
    assert 'django_jobs_queue_oldest_wait_seconds{queue="default"} 1' in body  # 1xx seconds
    assert "django_jobs_workers 1.0" in body


@pytest.mark.django_db(transaction=True)
def test_metrics_expose_worker_counters_and_durations(run_worker, staff):
    for i in range(3):
        enqueue(jobs.record, {"label": f"m{i}"})
    enqueue(jobs.snoozer, {"times": 1})
    enqueue(jobs.fatal, {})
    worker = run_worker()
    snapshot = worker._ops.snapshot()
    assert snapshot["started"] == 6  # 3 + the snoozer twice + the fatal one
    assert snapshot["outcomes"] == {"succeeded": 4, "snoozed": 1, "dead": 1}
    # A dead letter's job_finished carries no duration.
    assert sum(snapshot["duration_buckets"]) == 5
    WorkerBeatFactory(id="h:9:cc", pid=9, concurrency=2, stats=snapshot)
    body = scrape(staff)
    labels = 'host="h",outcome="{}",worker="h:9:cc"'
    assert f"django_jobs_jobs_finished_total{{{labels.format('succeeded')}}} 4.0" in body
    assert f"django_jobs_jobs_finished_total{{{labels.format('snoozed')}}} 1.0" in body
    assert f"django_jobs_jobs_finished_total{{{labels.format('dead')}}} 1.0" in body
    assert 'django_jobs_jobs_started_total{host="h",worker="h:9:cc"} 6.0' in body
    assert 'django_jobs_reexecutions_total{host="h",kind="rescued",worker="h:9:cc"} 0.0' in body
    assert 'django_jobs_job_duration_seconds_count{host="h",worker="h:9:cc"} 5.0' in body
    assert 'django_jobs_job_duration_seconds_bucket{host="h",le="+Inf",worker="h:9:cc"} 5.0' in body


def _enqueued_total(client, queue: str) -> float:
    prefix = f'django_jobs_enqueued_total{{queue="{queue}"}}'
    lines = [line for line in scrape(client).splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


@pytest.mark.django_db(transaction=True)
def test_enqueue_counter_of_this_process(staff):
    metrics.install()
    try:
        # The counter lives as long as the process: count from what it says now.
        before = _enqueued_total(staff, "default")
        enqueue(jobs.record, {"label": "counted"})
        enqueue(jobs.record, {"label": "dup"}, key="k1")
        enqueue(jobs.record, {"label": "dup"}, key="k1")  # a duplicate is not an enqueue
        assert _enqueued_total(staff, "default") - before == 2
    finally:
        signals.job_enqueued.disconnect(dispatch_uid="django_jobs.metrics.enqueued")


# ---- hand-edited heartbeat rows: no 500, one warning ---------------------------------------------

GOOD = {"claimed": 7, "started": 7, "outcomes": {"succeeded": 6, "dead": 1}}
MALFORMED = [
    [1, 2],
    "text",
    None,
    42,
    {"claimed": "many", "started": -3, "lost": None, "skipped": [1], "rescued": {"a": 1}},
    {"outcomes": [1, 2]},
    {"outcomes": {"succeeded": "x", "dead": -1, "weird": {"n": 1}}},
    {"duration_buckets": "x"},
    {"duration_buckets": [1, "a", None]},
    {"duration_buckets": [1, 2], "duration_sum": "long"},
    {"claimed": True, "started": 1e308},
]


def _hand_edit(worker_id: str, stats_json: str, queues_json: str = '["default"]') -> None:
    """Write the row's JSON columns with SQL, as someone fixing things by hand would."""
    table = WorkerBeat._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET stats = %s, queues = %s WHERE id = %s",  # noqa: S608
            [stats_json, queues_json, worker_id],
        )


def _beat(worker_id: str, stats: object) -> None:
    WorkerBeatFactory(id=worker_id, pid=len(worker_id), concurrency=2, stats={})
    _hand_edit(worker_id, json.dumps(stats))


@pytest.fixture
def _fresh_warnings():
    metrics._warned.clear()
    yield
    metrics._warned.clear()


@pytest.mark.usefixtures("_fresh_warnings")
@pytest.mark.parametrize("stats", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_stats_are_left_out_and_good_ones_kept(stats, caplog, staff):
    _beat("h:1:good", GOOD)
    _beat("h:2:bad", stats)
    with caplog.at_level(logging.WARNING, logger="django_jobs.metrics"):
        body = scrape(staff)
        scrape(staff)
    assert 'django_jobs_jobs_claimed_total{host="h",worker="h:1:good"} 7.0' in body
    assert 'django_jobs_jobs_finished_total{host="h",outcome="dead",worker="h:1:good"} 1.0' in body
    assert "django_jobs_workers 2.0" in body
    # Nothing of the bad row that is not a counter reaches the scrape.
    bad_lines = [line for line in body.splitlines() if 'worker="h:2:bad"' in line]
    assert bad_lines  # the worker still shows, with its outcomes at zero at least
    for line in bad_lines:
        value = float(line.rsplit(" ", 1)[1])
        assert value >= 0 and value != float("inf")
    assert not any("many" in line or "-3" in line or "x" == line[-1] for line in bad_lines)
    # One warning for the bad worker, however many scrapes.
    warnings = [r for r in caplog.records if "malformed stats" in r.getMessage()]
    assert len(warnings) == 1
    assert "h:2:bad" in warnings[0].getMessage()


@pytest.mark.usefixtures("_fresh_warnings")
def test_a_huge_number_in_the_stats_is_left_out(staff):
    _beat("h:3:huge", {})
    _hand_edit("h:3:huge", '{"claimed": ' + "9" * 400 + ', "started": 2}')
    body = scrape(staff)
    assert 'django_jobs_jobs_started_total{host="h",worker="h:3:huge"} 2.0' in body
    assert 'django_jobs_jobs_claimed_total{host="h",worker="h:3:huge"}' not in body


@pytest.mark.usefixtures("_fresh_warnings")
def test_status_command_survives_malformed_queues_and_stats(staff):
    _beat("h:4:odd", [1, 2])
    _hand_edit("h:4:odd", '"text"', queues_json="5")
    out = StringIO()
    call_command("jobs", "status", stdout=out)
    assert "1 live worker(s)" in out.getvalue()
    call_command("jobs", "status", "--json", stdout=out)
    scrape(staff)
