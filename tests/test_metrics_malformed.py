"""The metrics view and `jobs status` over hand-edited heartbeat rows: no 500, one warning."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_jobs import metrics
from django_jobs.models import WorkerBeat

pytestmark = pytest.mark.django_db

pytest.importorskip("prometheus_client")

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


def _staff():
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def _hand_edit(worker_id: str, stats_json: str, queues_json: str = '["default"]') -> None:
    """Write the row's JSON columns with SQL, as someone fixing things by hand would."""
    table = WorkerBeat._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET stats = %s, queues = %s WHERE id = %s",  # noqa: S608
            [stats_json, queues_json, worker_id],
        )


def _beat(worker_id: str, stats: object) -> None:
    now = timezone.now()
    WorkerBeat.objects.create(
        id=worker_id, host="h", pid=len(worker_id), queues=["default"], concurrency=2,
        started_at=now, last_seen_at=now, stats={},
    )  # fmt: skip
    _hand_edit(worker_id, json.dumps(stats))


@pytest.fixture(autouse=True)
def _fresh_warnings():
    metrics._warned.clear()
    yield
    metrics._warned.clear()


@pytest.mark.parametrize("stats", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_stats_are_left_out_and_good_ones_kept(stats, caplog):
    _beat("h:1:good", GOOD)
    _beat("h:2:bad", stats)
    client = _staff()
    with caplog.at_level(logging.WARNING, logger="django_jobs.metrics"):
        first = client.get("/metrics/jobs")
        second = client.get("/metrics/jobs")
    assert first.status_code == second.status_code == 200
    body = first.content.decode()
    assert 'django_jobs_jobs_claimed_total{host="h",worker="h:1:good"} 7.0' in body
    assert 'django_jobs_jobs_finished_total{host="h",outcome="dead",worker="h:1:good"} 1.0' in body
    assert "django_jobs_workers 2.0" in body
    # Nothing of the bad row that is not a counter reaches the scrape.
    bad_lines = [line for line in body.splitlines() if 'worker="h:2:bad"' in line]
    for line in bad_lines:
        value = float(line.rsplit(" ", 1)[1])
        assert value >= 0 and value != float("inf")
    assert not any("many" in line or "-3" in line or "x" == line[-1] for line in bad_lines)
    # One warning for the bad worker, however many scrapes.
    warnings = [r for r in caplog.records if "malformed stats" in r.getMessage()]
    assert len(warnings) == 1
    assert "h:2:bad" in warnings[0].getMessage()


def test_a_huge_number_in_the_stats_is_left_out(caplog):
    _beat("h:3:huge", {})
    _hand_edit("h:3:huge", '{"claimed": ' + "9" * 400 + ', "started": 2}')
    response = _staff().get("/metrics/jobs")
    assert response.status_code == 200
    body = response.content.decode()
    assert 'django_jobs_jobs_started_total{host="h",worker="h:3:huge"} 2.0' in body
    assert 'django_jobs_jobs_claimed_total{host="h",worker="h:3:huge"}' not in body


def test_status_command_survives_malformed_queues_and_stats():
    _beat("h:4:odd", [1, 2])
    _hand_edit("h:4:odd", '"text"', queues_json="5")
    out = StringIO()
    call_command("jobs", "status", stdout=out)
    assert "1 live worker(s)" in out.getvalue()
    call_command("jobs", "status", "--json", stdout=out)
    assert _staff().get("/metrics/jobs").status_code == 200
