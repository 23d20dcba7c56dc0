"""The live-job and marker admins: states, filters, run now, cancel, search, query counts."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from tests.admin_fixtures import action, messages_of, url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory

pytestmark = pytest.mark.django_db


def shown(response):
    return [row.pk for row in response.context["cl"].result_list]


@pytest.fixture
def three_states():
    now = timezone.now()
    return {
        "waiting": JobFactory(name="tests.record", run_at=now - timedelta(minutes=1)),
        "scheduled": JobFactory(name="tests.noop", queue="emails", run_at=now + timedelta(hours=1)),
        "running": JobFactory(
            name="tests.record", leased=True, worker="web-1:4242:abc123", claim_seq=7
        ),
    }


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"waiting", "scheduled", "running"}),
        ({"state": "waiting"}, {"waiting"}),
        ({"state": "scheduled"}, {"scheduled"}),
        ({"state": "running"}, {"running"}),
        ({"queue": "emails"}, {"scheduled"}),
        ({"name": "tests.record"}, {"waiting", "running"}),
    ],
)
def test_job_filters(admin_client_, three_states, params, expected):
    response = admin_client_.get(url("job_changelist"), params)
    assert response.status_code == 200
    assert set(shown(response)) == {three_states[k].id for k in expected}


def test_job_list_shows_state_and_lease_holder(admin_client_, three_states):
    JobFactory(
        lease_expired=True,
        worker="web-2:1:dead",
        lease_expires_at=timezone.now() - timedelta(seconds=5),
    )
    response = admin_client_.get(url("job_changelist"))
    assert response.context["cl"].list_display == [
        "action_checkbox",
        "name_cell",
        "queue_cell",
        "state_label",
        "run_at_cell",
        "lease",
    ]
    text = response.content.decode().replace("<wbr>", "")  # names may wrap after . - :
    # Each row's state cell, its first word (the state filter's links name them all, too).
    cells = re.findall(r'<td class="field-state_label">(.*?)</td>', text, re.S)
    states = sorted(re.sub(r"<[^>]+>", " ", cell).split()[0].lower() for cell in cells)
    assert states == ["running", "scheduled", "waiting", "waiting"]  # an expired lease waits
    assert "web-1:4242:abc123" in text and "#7" not in text  # the worker, not the claim number
    assert "lease expired: rescue is due" in text and "expired 5s ago" in text
    assert re.search(r"\d+s left", text)  # the running job's lease: how long it has left
    assert "attempt 1 of 3" in text  # the state says which attempt runs
    local = timezone.localtime(three_states["scheduled"].run_at)
    # Run at, to the minute (the seconds in its title): it no longer clips.
    assert f'title="{local:%Y-%m-%d %H:%M:%S}">{local:%Y-%m-%d %H:%M}</span>' in text


def test_a_retry_waiting_says_how_many_attempts_were_made(admin_client_):
    # Three attempts failed: the next is the fourth, so "attempt 3 of 8" would mislead.
    job = JobFactory(attempts=3, max_attempts=8)
    for page in (url("job_changelist"), url("job_change", job.pk)):
        text = admin_client_.get(page).content.decode()
        assert "3 of 8 attempts made" in text and "attempt 3 of 8" not in text


def test_job_detail_masks_the_payload(admin_client_):
    job = JobFactory(payload=json.dumps({"token": "abc", "to": "ada@example.com"}))
    text = admin_client_.get(url("job_change", job.pk)).content.decode()
    assert "abc" not in text.replace(str(job.pk), "")
    assert "&quot;token&quot;: &quot;********&quot;" in text and "ada@example.com" in text


def test_job_detail_shows_the_flow_control_partition(admin_client_):
    job = JobFactory(partition="customer-4217")
    text = admin_client_.get(url("job_change", job.pk)).content.decode()
    assert "customer-4217" in text


def test_job_search(admin_client_, three_states):
    keyed = JobFactory(key="order-9")

    def search(term):
        return set(shown(admin_client_.get(url("job_changelist"), {"q": term})))

    assert search(str(three_states["running"].id)) == {three_states["running"].id}
    assert search("order-9") == {keyed.id}
    assert search("noop") == {three_states["scheduled"].id, keyed.id}


def test_run_now_action(admin_client_, three_states):
    ids = [j.id for j in three_states.values()]
    response = action(admin_client_, "job", "run_now", ids)

    assert messages_of(response) == [
        "1 made due now; 2 not scheduled (already due or running), left alone."
    ]
    assert Job.objects.scheduled().count() == 0
    assert Job.objects.get(pk=three_states["scheduled"].pk).run_at <= timezone.now()
    assert LogEntry.objects.get().object_id == str(three_states["scheduled"].pk)


def test_cancel_action_moves_waiting_jobs_and_says_why_running_ones_stay(
    admin_client_, three_states
):
    ids = [j.id for j in three_states.values()]
    response = action(admin_client_, "job", "cancel", ids)

    [message] = messages_of(response)
    assert message.startswith("2 cancelled (moved to the dead letters, where they can be replayed)")
    assert "; asked the workers of 1 running job(s) to stop them" in message
    # The running job stays live, flagged: its worker stops it at the next heartbeat.
    [running] = Job.objects.all()
    assert running.id == three_states["running"].id and running.cancel_requested_at is not None
    letters = DeadLetter.objects.filter(reason=DeadReason.CANCELLED)
    assert {x.id for x in letters} == {three_states["waiting"].id, three_states["scheduled"].id}
    assert (
        letters.first().errors[-1]["message"]
        == f"cancelled by {response.wsgi_request.user.username}"
    )
    # One entry per job: two dead-lettered, one asked to stop.
    assert sorted(LogEntry.objects.values_list("object_id", flat=True)) == sorted(
        str(j.id) for j in three_states.values()
    )
    # The cancelled jobs are dead letters now: inspectable and replayable.
    ids = [x.id for x in letters]
    response = action(admin_client_, "deadletter", "replay_selected", ids, post="yes")
    assert messages_of(response) == ["2 replayed."]


def test_cancel_of_a_job_that_finished_meanwhile(admin_client_):
    job = JobFactory()
    gone = JobFactory()
    Job.objects.filter(pk=gone.pk).delete()
    response = action(admin_client_, "job", "cancel", [job.id, gone.id])
    assert messages_of(response) == [
        "1 cancelled (moved to the dead letters, where they can be replayed); "
        "1 no longer live (finished meanwhile)."
    ]


# ---- completion markers -------------------------------------------------------


def test_marker_search_by_key_or_job_id_and_date_range(admin_client_):
    now = timezone.now().replace(microsecond=0)
    old = MarkerFactory(
        key="invoice-1", completed_at=now - timedelta(days=3), result={"password": "x", "ok": 1}
    )
    new = MarkerFactory(key="invoice-2", completed_at=now)

    def get(params):
        return set(shown(admin_client_.get(url("completionmarker_changelist"), params)))

    assert get({"q": "invoice-1"}) == {old.pk}
    assert get({"q": str(new.job_id)}) == {new.pk}
    assert get({"q": "invoice"}) == set()  # exact: a LIKE would read every marker
    start = timezone.localtime(now - timedelta(days=4))
    end = timezone.localtime(now - timedelta(days=2))
    assert get(
        {
            "completed_at__range__gte": start.strftime("%Y-%m-%d"),
            "completed_at__range__lte": end.strftime("%Y-%m-%d"),
        }
    ) == {old.pk}
    text = admin_client_.get(url("completionmarker_change", old.pk)).content.decode()
    assert "&quot;password&quot;: &quot;********&quot;" in text
    assert 'name="_save"' not in text


# ---- query counts --------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "make"),
    [
        ("deadletter_changelist", lambda n: DeadLetterFactory.create_batch(n)),
        ("job_changelist", lambda n: JobFactory.create_batch(n)),
        ("completionmarker_changelist", lambda n: MarkerFactory.create_batch(n)),
    ],
)
def test_change_lists_make_a_fixed_number_of_queries(
    admin_client_, django_assert_max_num_queries, page, make
):
    """However many rows, a change list costs the same queries (no query per row)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make(3)
    admin_client_.get(url(page))  # warm caches (content types, session)
    with CaptureQueriesContext(connection) as few:
        assert admin_client_.get(url(page)).status_code == 200
    make(45)
    with CaptureQueriesContext(connection) as many:
        assert admin_client_.get(url(page)).status_code == 200
    assert len(many) == len(few)
    with django_assert_max_num_queries(QUERIES[page]):
        admin_client_.get(url(page))


# Session, user, the capped count, the page of rows; the name and queue filters'
# distinct values (dead letters, jobs); the date hierarchy's range and dates (dead letters).
QUERIES = {"deadletter_changelist": 8, "job_changelist": 6, "completionmarker_changelist": 4}


def test_markers_are_never_deleted_from_the_admin(admin_client_):
    marker = MarkerFactory()
    assert (
        admin_client_.post(url("completionmarker_delete", marker.pk), {"post": "yes"}).status_code
        == 403
    )
    assert CompletionMarker.objects.exists()


def test_long_lists_are_counted_up_to_a_limit_then_estimated(admin_client_, monkeypatch):
    from django_jobs.admin import base as jobs_admin
    from tests.conftest import POSTGRES

    monkeypatch.setattr(jobs_admin, "EXACT_COUNT_LIMIT", 5)
    DeadLetterFactory.create_batch(8)
    response = admin_client_.get(url("deadletter_changelist"))
    cl = response.context["cl"]
    if POSTGRES:  # the planner's estimate, never below what was counted
        assert cl.paginator.estimated and cl.result_count >= 6
        assert f"about {cl.result_count} dead letters" in response.content.decode()
    else:  # SQLite has no estimate: it counts
        assert not cl.paginator.estimated and cl.result_count == 8
    small = admin_client_.get(url("deadletter_changelist"), {"reason": "fatal"})
    assert not small.context["cl"].paginator.estimated and small.context["cl"].result_count == 0
