"""The queue dashboard: per-queue counts, the oldest waiting job, the last hour's chart, reasons."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.templatetags.static import static
from django.utils import timezone

from django_jobs import dashboard
from django_jobs.models import DeadReason
from tests.admin_fixtures import url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory, WorkerBeatFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def activity():
    now = timezone.now()
    JobFactory.create_batch(3, queue="default", run_at=now - timedelta(minutes=5))
    JobFactory(queue="default", run_at=now - timedelta(minutes=42))  # the oldest waiting one
    JobFactory.create_batch(2, queue="emails", run_at=now + timedelta(hours=1))
    JobFactory(queue="emails", leased=True)
    MarkerFactory.create_batch(4, completed_at=now - timedelta(minutes=2))
    MarkerFactory.create_batch(2, completed_at=now - timedelta(minutes=30))
    MarkerFactory(completed_at=now - timedelta(hours=3))  # outside the hour
    DeadLetterFactory.create_batch(2, reason=DeadReason.FATAL, dead_at=now - timedelta(minutes=1))
    DeadLetterFactory(reason=DeadReason.ATTEMPTS_EXHAUSTED, dead_at=now - timedelta(days=2))
    DeadLetterFactory(
        reason=DeadReason.FATAL,
        dead_at=now - timedelta(days=1),
        replayed_at=now,
        replay_job_id=JobFactory(queue="x").id,
    )


def test_snapshot_counts(activity):
    snap = dashboard.snapshot()
    rows = {row.queue: row for row in snap.queues}
    assert (rows["default"].waiting, rows["default"].scheduled, rows["default"].running) == (
        4,
        0,
        0,
    )
    assert (rows["emails"].waiting, rows["emails"].scheduled, rows["emails"].running) == (0, 2, 1)
    assert timedelta(minutes=41) < rows["default"].oldest_age < timedelta(minutes=43)
    assert rows["emails"].oldest_age is None
    assert len(snap.completed) == len(snap.dead) == 60
    assert snap.completed_total == 6 and snap.dead_total == 2
    assert snap.completed[-3] + snap.completed[-2] + snap.completed[-1] == 4  # two minutes ago
    assert snap.dead_by_reason == [
        ("fatal", "fatal error", 2),
        ("attempts_exhausted", "attempts exhausted", 1),
    ]


def test_dashboard_page(admin_client_, activity):
    response = admin_client_.get(url("dashboard"))
    text = response.content.decode()
    text = text[text.index('id="content-main"') :]

    assert response.status_code == 200
    assert re.search(r'data-queue="default">.*?>4</a>.*?>0</a>.*?>0</a>.*?42m', text, re.S)
    assert re.search(r'data-queue="emails">.*?>0</a>.*?>2</a>.*?>1</a>', text, re.S)
    assert "6 completed, 2 dead-lettered" in text
    assert text.count('<svg xmlns="http://www.w3.org/2000/svg" class="django-jobs-chart"') == 2
    assert len(re.findall(r"<rect ", text)) == 120  # a bar per minute, per chart
    assert re.search(r"<title>\d\d:\d\d: 4 completed</title>", text)  # each bar tells its count
    assert "?reason=fatal&amp;replayed=no" in text  # reasons link to their letters


def test_dashboard_needs_no_script_no_inline_style_and_no_cdn(admin_client_, activity):
    text = admin_client_.get(url("dashboard")).content.decode()
    main = text[text.index('id="content-main"') :]
    assert "<script" not in main
    assert "style=" not in text  # a strict CSP (no 'unsafe-inline') would block these
    assert "<style" not in text
    external = set(re.findall(r'(?:src|href)="(https?://[^"]+)"', text))
    assert external == set()
    assert f'<link rel="stylesheet" href="{static("django_jobs/admin.css")}">' in text


def test_dashboard_is_linked_from_the_app_index_and_the_change_lists(admin_client_):
    dashboard_url = url("dashboard")
    assert dashboard_url in admin_client_.get("/admin/django_jobs/").content.decode()
    for page in ("deadletter_changelist", "job_changelist", "completionmarker_changelist"):
        assert dashboard_url in admin_client_.get(url(page)).content.decode()


def test_an_empty_installation(admin_client_):
    text = admin_client_.get(url("dashboard")).content.decode()
    assert "0 completed, 0 dead-lettered" in text
    assert "nothing is waiting to be put right" in text
    assert 'data-queue="default"' in text  # the handlers' queues, even when empty


def test_durations():
    d = dashboard.duration
    assert [
        d(None),
        d(timedelta(seconds=5)),
        d(timedelta(minutes=3, seconds=4)),
        d(timedelta(minutes=42)),
        d(timedelta(hours=3, minutes=5)),
        d(timedelta(days=2, hours=4)),
    ] == ["—", "5s", "3m 4s", "42m", "3h 5m", "2d 4h"]


def test_a_queue_no_handler_declares_is_flagged(admin_client_):
    JobFactory(queue="orphans")
    JobFactory(queue="default")
    rows = {row.queue: row for row in dashboard.snapshot().queues}
    assert not rows["orphans"].declared
    assert rows["default"].declared
    page = admin_client_.get(url("dashboard")).content.decode()
    orphans = page[page.index('data-queue="orphans"') :]
    assert "no handler" in orphans[: orphans.index("</tr>")]
    default = page[page.index('data-queue="default"') :]
    assert "no handler" not in default[: default.index("</tr>")]


def test_jobs_waiting_with_no_live_worker_say_to_start_one(admin_client_):
    # The first run: orders placed, runjobs never started; the jobs wait and nothing else says why.
    JobFactory(queue="default")
    WorkerBeatFactory(last_seen_at=timezone.now() - timedelta(hours=1))  # long dead
    page = admin_client_.get(url("dashboard")).content.decode()
    assert "0 live workers" in page
    assert 'id="django-jobs-stalled"' in page and "python manage.py runjobs" in page
    WorkerBeatFactory()
    page = admin_client_.get(url("dashboard")).content.decode()
    assert "1 live worker<" in page and 'id="django-jobs-stalled"' not in page


def test_no_worker_and_nothing_waiting_is_not_an_alarm(admin_client_):
    JobFactory(queue="default", run_at=timezone.now() + timedelta(hours=1))  # scheduled only
    page = admin_client_.get(url("dashboard")).content.decode()
    assert "0 live workers" in page and 'id="django-jobs-stalled"' not in page


def test_blocked_steps_have_a_column_of_their_own(admin_client_, activity):
    from django_jobs.models import blocked_until

    JobFactory.create_batch(3, queue="emails", run_at=blocked_until(), waiting_for=1)
    rows = {row.queue: row for row in dashboard.snapshot().queues}
    emails = rows["emails"]
    assert (emails.waiting, emails.scheduled, emails.running, emails.blocked) == (0, 2, 1, 3)
    assert rows["default"].blocked == 0
    text = admin_client_.get(url("dashboard")).content.decode()
    assert re.search(
        r'data-queue="emails">.*?>0</a>.*?>2</a>.*?>1</a>.*?'
        r'href="[^"]*queue=emails&amp;state=blocked">3</a>',
        text,
        re.S,
    )
