"""The dead-letter admin: change list, filters, search, the detail page, replay and delete."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import control
from django_jobs.models import DeadLetter, DeadReason, Job
from django_jobs.rows import uuid7
from tests.admin_fixtures import action, messages_of, url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory

pytestmark = pytest.mark.django_db


def shown(response):
    return [letter.id for letter in response.context["cl"].result_list]


def test_change_list_columns_newest_first(admin_client_):
    now = timezone.now()
    old = DeadLetterFactory(dead_at=now - timedelta(days=2), error="builtins.KeyError: 'x'")
    new = DeadLetterFactory(dead_at=now, error="builtins.RuntimeError: " + "long " * 40)
    mid = DeadLetterFactory(dead_at=now - timedelta(hours=1), replayed_at=now, replay_job_id=old.id)

    response = admin_client_.get(url("deadletter_changelist"))

    assert response.status_code == 200
    assert shown(response) == [new.id, mid.id, old.id]
    text = response.content.decode()
    assert response.context["cl"].list_display == [
        "action_checkbox",
        "name_cell",
        "reason",
        "dead_at_cell",
        "error_line",
        "replayed",
    ]
    for header in ("Name", "Reason", "Dead at", "Error", "Replayed"):
        assert f">{header}</" in text, header
    # Neutral marks: "not replayed" is no error (no red icon), "replayed" says by whom in a title.
    assert 'alt="False"' not in text and "icon-no" not in text
    assert text.count('<span class="django-jobs-quiet" title="no">–</span>') == 2
    assert "✓ yes" in text
    # One line, cut short, the whole line in the title.
    long_line = "builtins.RuntimeError: " + "long " * 40
    assert f'title="{long_line.strip()}"' in text
    assert "builtins.RuntimeError: long long" in text and "…" in text
    assert response.context["cl"].date_hierarchy == "dead_at"
    assert f"dead_at__year={now.year}" in text  # the date hierarchy's links


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"reason": "fatal"}, {"fatal"}),
        ({"replayed": "no"}, {"fatal", "exhausted", "other"}),
        ({"replayed": "yes"}, {"replayed"}),
        ({"name": "tests.fatal"}, {"fatal"}),
        ({"queue": "emails"}, {"other"}),
    ],
)
def test_filters(admin_client_, params, expected):
    letters = {
        "fatal": DeadLetterFactory(name="tests.fatal", reason=DeadReason.FATAL),
        "exhausted": DeadLetterFactory(reason=DeadReason.ATTEMPTS_EXHAUSTED),
        "other": DeadLetterFactory(queue="emails", reason=DeadReason.INVALID_PAYLOAD),
    }
    letters["replayed"] = DeadLetterFactory(
        replayed_at=timezone.now(), replay_job_id=letters["other"].id
    )
    response = admin_client_.get(url("deadletter_changelist"), params)
    assert response.status_code == 200
    assert set(shown(response)) == {letters[k].id for k in expected}


def test_date_range_filters_on_dead_at_and_enqueued_at(admin_client_):
    base = timezone.now().replace(microsecond=0) - timedelta(days=10)
    early = DeadLetterFactory(enqueued_at=base, dead_at=base + timedelta(hours=1))
    late = DeadLetterFactory(
        enqueued_at=base + timedelta(days=5), dead_at=base + timedelta(days=5, hours=2)
    )
    local = timezone.localtime

    def range_of(field, start, end):
        return {
            f"{field}__range__gte": local(start).strftime("%Y-%m-%d"),
            f"{field}__range__lte": local(end).strftime("%Y-%m-%d"),
        }

    response = admin_client_.get(
        url("deadletter_changelist"), range_of("dead_at", base, base + timedelta(hours=2))
    )
    assert shown(response) == [early.id]
    response = admin_client_.get(
        url("deadletter_changelist"),
        range_of("enqueued_at", base + timedelta(days=4), base + timedelta(days=6)),
    )
    assert shown(response) == [late.id]
    # Both filters show their date inputs, the one in use with its dates (every link on the
    # page carries the query string, so the parameter's name alone proves nothing).
    page = response.content.decode()
    assert date_input(page, "dead_at__range__gte") == ""
    start = local(base + timedelta(days=4)).strftime("%Y-%m-%d")
    assert date_input(page, "enqueued_at__range__gte") == start


def date_input(page, name):
    """The value of the range filter's date input called name ("" when empty)."""
    found = re.search(rf'<input type="text" name="{name}"([^>]*)id="id_{name}"', page)
    assert found, f"no date input {name}"
    value = re.search(r'value="([^"]*)"', found[1])
    return value[1] if value else ""


def test_search_by_job_id_key_name_and_error(admin_client_):
    a = DeadLetterFactory(
        key="invoice-17", name="tests.record", error="builtins.ValueError: card declined"
    )
    b = DeadLetterFactory(name="tests.fatal", error="FatalError: discontinued")
    replayed_as = uuid7()
    c = DeadLetterFactory(replayed_at=timezone.now(), replay_job_id=replayed_as)

    def search(term):
        return set(shown(admin_client_.get(url("deadletter_changelist"), {"q": term})))

    assert search(str(a.id)) == {a.id}
    assert search(str(replayed_as)) == {c.id}  # the letter a job was replayed from
    assert search("invoice-17") == {a.id}
    assert search("invoice") == set()  # keys match exactly
    assert search("fatal") == {b.id}
    assert search("card declined") == {a.id}


def test_the_error_column_wraps_after_the_dots_of_the_exception_path(admin_client_):
    DeadLetterFactory(error="django_jobs.exceptions.FatalError: order 5: item discontinued")
    page = admin_client_.get(url("deadletter_changelist")).text
    # Not mid-word ("FatalE|rror") in a narrow column: after each dot of the path.
    assert "django_<wbr>jobs.<wbr>exceptions.<wbr>FatalError:<wbr> order 5:<wbr>" in page


def test_detail_page_is_read_only_with_masked_pretty_payload_and_every_error(admin_client_):
    letter = DeadLetterFactory(
        payload=json.dumps(
            {"user": 7, "password": "hunter2", "nested": {"api_key": "sk-123", "n": [1, 2]}}
        ),
        error="builtins.RuntimeError: third",
        traceback='Traceback (most recent call last):\n  File "x.py"\nRuntimeError: third',
        errors=[
            {
                "attempt": 1,
                "at": "2026-01-02T03:04:05+00:00",
                "type": "builtins.RuntimeError",
                "message": "first <b>",
                "traceback": "TB-ONE",
                "worker": "host:1:aa",
            },
            {
                "attempt": 2,
                "at": "2026-01-02T03:05:05+00:00",
                "type": "builtins.RuntimeError",
                "message": "second",
                "traceback": "TB-TWO",
                "worker": "host:1:aa",
            },
            {
                "attempt": 3,
                "at": "2026-01-02T03:06:05+00:00",
                "type": "builtins.RuntimeError",
                "message": "third",
                "traceback": "TB-THREE",
                "worker": "host:2:bb",
            },
        ],
    )
    response = admin_client_.get(url("deadletter_change", letter.pk))
    text = response.content.decode()

    assert response.status_code == 200
    assert "hunter2" not in text and "sk-123" not in text
    assert "&quot;password&quot;: &quot;********&quot;" in text
    assert "&quot;api_key&quot;: &quot;********&quot;" in text
    assert "\n  &quot;user&quot;: 7," in text  # indented JSON
    assert "<pre>Traceback (most recent call last):" in text
    for tb in ("TB-ONE", "TB-TWO", "TB-THREE"):
        assert tb in text
    assert "2026-01-02 03:04:05" in text and "2026-01-02 03:06:05" in text
    assert "first &lt;b&gt;" in text  # escaped, never rendered
    assert 'name="_save"' not in text  # no save button: nothing is edited here
    assert "django-jobs-replay-form" in text  # a superuser may replay


def test_detail_page_links_the_replayed_job_then_its_marker_or_its_new_letter(admin_client_):
    letter = DeadLetterFactory()
    control.replay(DeadLetter.objects.filter(pk=letter.pk), by="ada")
    letter.refresh_from_db()
    job_id = letter.replay_job_id

    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert url("job_change", job_id) in text and "is live" in text
    assert "django-jobs-replay-form" not in text  # replayed: no second replay offered
    assert "by ada" in text

    Job.objects.filter(id=job_id).delete()
    marker = MarkerFactory(job_id=job_id)
    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert url("completionmarker_change", marker.pk) in text
    marker_page = admin_client_.get(url("completionmarker_change", marker.pk)).content.decode()
    assert url("deadletter_change", letter.pk) in marker_page  # and back

    marker.delete()
    again = DeadLetterFactory(id=job_id)
    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert url("deadletter_change", again.pk) in text and "died again" in text


def test_replay_action_reports_counts_and_logs_each_replay(admin_client_):
    fresh = DeadLetterFactory.create_batch(3)
    done = DeadLetterFactory(replayed_at=timezone.now(), replay_job_id=fresh[0].id)

    ids = [*[f.id for f in fresh], done.id]
    response = action(admin_client_, "deadletter", "replay_selected", ids, post="yes")

    assert messages_of(response) == ["3 replayed, 1 already replayed."]
    assert Job.objects.count() == 3
    entries = LogEntry.objects.filter(action_flag=CHANGE, content_type__model="deadletter")
    assert sorted(e.object_id for e in entries) == sorted(str(f.id) for f in fresh)
    letter = DeadLetter.objects.get(pk=fresh[1].pk)
    assert (
        entries.get(object_id=str(letter.pk)).change_message
        == f"Replayed as job {letter.replay_job_id}."
    )
    assert letter.replayed_by == response.wsgi_request.user.username


def test_the_replay_action_costs_the_same_statements_for_40_letters_as_for_20(admin_client_):
    def statements(count):
        ids = [letter.id for letter in DeadLetterFactory.create_batch(count, name="tests.noop")]
        with CaptureQueriesContext(connection) as ctx:
            response = action(admin_client_, "deadletter", "replay_selected", ids, post="yes")
        assert messages_of(response) == [f"{count} replayed."]
        return len(ctx.captured_queries)

    # One batch of letters, one read of them and one INSERT of their LogEntry rows.
    assert statements(40) == statements(20)
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 60


def test_replaying_twice_makes_no_second_job(admin_client_):
    letter = DeadLetterFactory()
    action(admin_client_, "deadletter", "replay_selected", [letter.id], post="yes")
    response = action(admin_client_, "deadletter", "replay_selected", [letter.id], post="yes")

    assert messages_of(response) == ["0 replayed, 1 already replayed."]
    assert Job.objects.count() == 1


def test_replay_action_explains_what_it_left_alone(admin_client_):
    live = JobFactory(key="busy")
    held = DeadLetterFactory(key="busy")
    response = action(admin_client_, "deadletter", "replay_selected", [held.id], post="yes")
    assert messages_of(response) == ["0 replayed, 1 whose key a live job holds."]
    assert list(Job.objects.values_list("id", flat=True)) == [live.id]


def test_replay_button_on_the_detail_page(admin_client_):
    letter = DeadLetterFactory()
    response = admin_client_.post(url("deadletter_replay", letter.pk), follow=True)

    assert response.redirect_chain[-1][0] == url("deadletter_change", letter.pk)
    assert messages_of(response) == ["1 replayed."]
    job = Job.objects.get()
    assert DeadLetter.objects.get().replay_job_id == job.id
    assert admin_client_.post(url("deadletter_replay", letter.pk)).status_code == 302
    assert Job.objects.count() == 1  # the second click (or tab) did nothing
    assert LogEntry.objects.filter(object_id=str(letter.pk), action_flag=CHANGE).count() == 1


def test_replay_button_can_schedule_the_job_for_later(admin_client_):
    letter = DeadLetterFactory()
    later = timezone.localtime() + timedelta(days=1)
    admin_client_.post(
        url("deadletter_replay", letter.pk), {"run_at": later.strftime("%Y-%m-%dT%H:%M:%S")}
    )
    job = Job.objects.get()
    assert job.run_at == later.replace(microsecond=0)
    assert Job.objects.scheduled().count() == 1


def test_replay_button_refuses_a_bad_time_and_a_get(admin_client_):
    letter = DeadLetterFactory()
    response = admin_client_.post(
        url("deadletter_replay", letter.pk), {"run_at": "next tuesday"}, follow=True
    )
    assert messages_of(response) == [
        "Not replayed: the run-at time 'next tuesday' is not a date and time."
    ]
    assert admin_client_.get(url("deadletter_replay", letter.pk)).status_code == 405
    assert not Job.objects.exists()
    assert DeadLetter.objects.get().replayed_at is None


@pytest.mark.parametrize(
    "run_at",
    [
        "2024-02-30T10:00",
        "2024-13-01T00:00",
        "2024-01-01T25:00",
        "2024-01-01T10:61",
        "0001-01-01T00:00+05:00",
        "9999-12-31T23:59-05:00",
        "2024-01-01T10:00\x00",
        "99999-01-01T00:00",
        "2024-01-01T10:00" + "0" * 10_000,
    ],
)
def test_replay_button_answers_an_impossible_time_with_an_error(admin_client_, run_at):
    letter = DeadLetterFactory()
    response = admin_client_.post(
        url("deadletter_replay", letter.pk), {"run_at": run_at}, follow=True
    )
    assert response.status_code == 200
    [message] = messages_of(response)
    assert message.startswith("Not replayed: the run-at time ") and len(message) < 200
    assert not Job.objects.exists()
    assert DeadLetter.objects.get().replayed_at is None


def test_replay_of_a_missing_letter_redirects_with_a_message(admin_client_):
    missing = uuid7()
    response = admin_client_.post(url("deadletter_replay", missing), follow=True)
    assert response.status_code == 200
    assert messages_of(response) == [f"Not replayed: there is no dead letter {missing}."]
    assert not Job.objects.exists()


def test_delete_writes_log_entries(admin_client_):
    letters = DeadLetterFactory.create_batch(2)
    response = admin_client_.post(
        url("deadletter_changelist"),
        {
            "action": "delete_selected",
            "_selected_action": [str(x.id) for x in letters],
            "post": "yes",
        },
        follow=True,
    )
    assert response.status_code == 200
    assert not DeadLetter.objects.exists()
    assert (
        LogEntry.objects.filter(action_flag=DELETION, content_type__model="deadletter").count() == 2
    )


def test_replay_all_matching_a_filter_with_select_across(admin_client_):
    fatal = DeadLetterFactory.create_batch(3, reason=DeadReason.FATAL)
    other = DeadLetterFactory(reason=DeadReason.ATTEMPTS_EXHAUSTED)
    data = {
        "action": "replay_selected",
        "_selected_action": [str(fatal[0].id)],
        "select_across": "1",
        "post": "yes",
    }
    response = admin_client_.post(url("deadletter_changelist") + "?reason=fatal", data, follow=True)

    assert messages_of(response) == ["3 replayed."]
    assert {x.id for x in DeadLetter.objects.filter(replayed_at__isnull=False)} == {
        f.id for f in fatal
    }
    assert DeadLetter.objects.get(pk=other.pk).replayed_at is None
