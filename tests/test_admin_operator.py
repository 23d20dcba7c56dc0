"""The admin as an operator sees it: the letter's summary, replay offered only when it can
work, a confirmation before a bulk replay, date ranges without times, neutral marks, links."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs import control, dashboard
from django_jobs.models import DeadLetter, DeadReason, Job, QueueState
from tests.admin_fixtures import messages_of, url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory

pytestmark = pytest.mark.django_db


def content_main(response):
    text = response.content.decode()
    return text[text.index('id="content"') :]


# ---- the dead letter's page ------------------------------------------------------------


def test_summary_comes_first_with_reason_attempts_and_last_error(admin_client_):
    letter = DeadLetterFactory(
        reason=DeadReason.ATTEMPTS_EXHAUSTED,
        attempts=3,
        max_attempts=3,
        error="builtins.RuntimeError: card declined",
        payload='{"order": 7}',
    )
    response = admin_client_.get(url("deadletter_change", letter.pk))
    text = content_main(response)

    summary = text.index('id="django-jobs-summary"')
    assert summary < text.index("<fieldset")  # before every field of the page
    block = text[summary : text.index("<fieldset")]
    assert "attempts exhausted" in block and "3 / 3" in block
    assert "builtins.RuntimeError: card declined" in block
    assert 'id="django-jobs-replay-form"' in block  # the one replay section, in the summary
    assert text.count(">Replay</h") == 1
    # The title and the breadcrumbs say the reason in words, not its stored value.
    page = response.content.decode()
    assert "(attempts_exhausted)" not in page
    assert f"<h2>{letter.name} · attempts exhausted</h2>" in page
    assert re.search(r'aria-current="page">tests\.record · attempts exhausted<', page)


def test_the_delete_confirmation_names_the_reason_in_words(admin_client_):
    letter = DeadLetterFactory(reason=DeadReason.ATTEMPTS_EXHAUSTED)
    page = admin_client_.get(url("deadletter_delete", letter.pk)).content.decode()
    assert f"{letter.name} {letter.id} (attempts exhausted)" in page
    assert "(attempts_exhausted)" not in page


def test_summary_of_a_replayed_letter_says_by_whom_when_and_links_the_new_job(admin_client_):
    letter = DeadLetterFactory()
    control.replay(DeadLetter.objects.filter(pk=letter.pk), by="ada")
    letter.refresh_from_db()

    text = content_main(admin_client_.get(url("deadletter_change", letter.pk)))
    block = text[text.index('id="django-jobs-summary"') : text.index("<fieldset")]
    local = timezone.localtime(letter.replayed_at).strftime("%Y-%m-%d %H:%M:%S")
    assert f"Replayed at {local} by ada." in block
    assert url("job_change", letter.replay_job_id) in block and "is live" in block
    assert "django-jobs-replay-form" not in text
    assert text.count(">Replay</h") == 1


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("no handler", "No handler is registered under this name"),
        ("key done", "The work of its key has completed since"),
        ("key held", "A live job holds its key"),
    ],
)
def test_replay_is_not_offered_when_it_cannot_work_and_the_page_says_why(admin_client_, setup, why):
    if setup == "no handler":
        letter = DeadLetterFactory(name="shop.jobs.removed_in_the_last_deploy")
    elif setup == "key done":
        letter = DeadLetterFactory(key="order-7")
        MarkerFactory(key="order-7")
    else:
        letter = DeadLetterFactory(key="order-7")
        JobFactory(key="order-7")
    text = content_main(admin_client_.get(url("deadletter_change", letter.pk)))

    assert "django-jobs-replay-form" not in text
    assert 'id="django-jobs-replay-blocked"' in text and why in text
    # A forged POST is still refused by the model, and says so.
    response = admin_client_.post(url("deadletter_replay", letter.pk), follow=True)
    assert messages_of(response)[0].startswith("0 replayed")
    assert DeadLetter.objects.get(pk=letter.pk).replayed_at is None


def test_replay_permission_without_view_permission_cannot_use_the_button(login):
    letter = DeadLetterFactory()
    client = login("replay_deadletter")
    assert client.post(url("deadletter_replay", letter.pk)).status_code == 403
    assert not Job.objects.exists()
    assert DeadLetter.objects.get().replayed_at is None


# ---- replaying many: a confirmation first --------------------------------------------


def test_the_replay_action_asks_first_with_counts_per_handler(admin_client_):
    records = DeadLetterFactory.create_batch(3, name="tests.record")
    fatal = DeadLetterFactory.create_batch(2, name="tests.fatal")
    gone = DeadLetterFactory(name="shop.jobs.gone")
    done = DeadLetterFactory(
        name="tests.record", replayed_at=timezone.now(), replay_job_id=records[0].id
    )
    ids = [str(x.id) for x in (*records, *fatal, gone, done)]

    data = {"action": "replay_selected", "_selected_action": ids}
    response = admin_client_.post(url("deadletter_changelist"), data)

    assert response.status_code == 200
    assert not Job.objects.exists()  # nothing happens before "yes"
    text = content_main(response)
    assert "Replay 5 dead letters?" in text
    assert "1 selected letter was replayed already" in text
    assert "1 has no handler registered under its name" in text
    rows = re.findall(
        r'<tr><th scope="row">([^<]+)(?:<span[^>]*>[^<]*</span>)?</th>'
        r'<td class="num">(\d+)</td><td class="num">(\d+)</td>',
        text,
    )
    assert [(n.strip(), int(a), int(b)) for n, a, b in rows] == [
        ("tests.record", 3, 1),
        ("tests.fatal", 2, 0),
        ("shop.jobs.gone", 1, 0),
    ]
    assert "(no handler registered)" in text
    for pk in ids:
        assert f'name="_selected_action" value="{pk}"' in text
    assert 'name="post" value="yes"' in text and "No, take me back" in text

    # "Yes" posts the same form back, with post=yes.
    yes = {**data, "post": "yes"}
    response = admin_client_.post(url("deadletter_changelist"), yes, follow=True)
    assert messages_of(response) == [
        "5 replayed, 1 already replayed, 1 with no handler registered under its name."
    ]
    assert Job.objects.count() == 5


def test_the_confirmation_keeps_select_across_and_the_filter(admin_client_):
    fatal = DeadLetterFactory.create_batch(3, reason=DeadReason.FATAL)
    other = DeadLetterFactory(reason=DeadReason.ATTEMPTS_EXHAUSTED)
    target = url("deadletter_changelist") + "?reason=fatal"
    data = {
        "action": "replay_selected",
        "_selected_action": [str(fatal[0].id)],
        "select_across": "1",
    }

    text = content_main(admin_client_.post(target, data))
    assert "Replay 3 dead letters?" in text
    assert 'name="select_across" value="1"' in text
    assert '<form method="post">' in text  # posts back to the filtered list's own URL
    assert f'href="{target}"' in text  # "No, take me back" keeps the filter

    admin_client_.post(target, {**data, "post": "yes"})
    assert set(
        DeadLetter.objects.filter(replayed_at__isnull=False).values_list("id", flat=True)
    ) == {x.id for x in fatal}
    assert DeadLetter.objects.get(pk=other.pk).replayed_at is None


def test_a_confirmation_with_nothing_to_replay_offers_no_yes(admin_client_):
    gone = DeadLetterFactory(name="shop.jobs.gone")
    data = {"action": "replay_selected", "_selected_action": [str(gone.id)]}
    text = content_main(admin_client_.post(url("deadletter_changelist"), data))
    assert "None of the selected dead letters can be replayed" in text
    assert 'id="django-jobs-replay-confirm"' not in text


# ---- date ranges without times ---------------------------------------------------------


def test_a_range_of_days_filters_without_any_time(admin_client_):
    today = timezone.localdate()
    now = timezone.now()
    old = DeadLetterFactory(dead_at=now - timedelta(days=5))
    new = DeadLetterFactory(dead_at=now)

    page = admin_client_.get(url("deadletter_changelist"))
    text = page.content.decode()
    assert 'name="dead_at__range__gte"' in text and 'placeholder="From date"' in text
    assert 'placeholder="To date"' in text
    assert "dead_at__range__gte_1" not in text  # no time inputs at all

    def letters(start, end):
        response = admin_client_.get(
            url("deadletter_changelist"),
            {"dead_at__range__gte": start.isoformat(), "dead_at__range__lte": end.isoformat()},
        )
        assert "Enter a valid" not in response.content.decode()
        return {x.id for x in response.context["cl"].result_list}

    assert letters(today, today) == {new.id}  # one day, all of it
    assert letters(today - timedelta(days=6), today - timedelta(days=4)) == {old.id}
    assert letters(today - timedelta(days=6), today) == {old.id, new.id}
    response = admin_client_.get(
        url("deadletter_changelist"), {"dead_at__range__gte": today.isoformat()}
    )
    assert {x.id for x in response.context["cl"].result_list} == {new.id}  # open-ended


# ---- marks, links, the chart -----------------------------------------------------------


def test_queues_show_a_neutral_mark_when_not_paused(admin_client_):
    QueueState.objects.ensure(["default", "emails"])
    QueueState.objects.filter(name="emails").pause(by="ada")
    text = content_main(admin_client_.get(url("queuestate_changelist")))
    assert "icon-no" not in text and 'alt="False"' not in text
    assert '<strong class="django-jobs-paused">paused</strong>' in text
    assert '<span class="django-jobs-quiet" title="no">–</span>' in text


@pytest.mark.parametrize(
    "page",
    ["schedule", "queuestate", "workerbeat", "runningjob", "deadletter", "job", "completionmarker"],
)
def test_every_list_links_the_dashboard(admin_client_, page):
    text = content_main(admin_client_.get(url(f"{page}_changelist")))
    assert f'href="{url("dashboard")}"' in text


def test_the_admin_index_links_the_dashboard_for_those_who_may_see_it(admin_client_, login):
    text = admin_client_.get("/admin/").content.decode()
    assert 'id="django-jobs-index-dashboard"' in text and f'href="{url("dashboard")}"' in text
    other = login()  # staff without any django_jobs permission
    text = other.get("/admin/").content.decode()
    assert "django-jobs-index-dashboard" not in text


def test_the_chart_keeps_its_end_labels_inside(admin_client_):
    chart = dashboard.bar_chart([1] * 60, start=timezone.now(), title="t", unit="u", color="#000")
    width = int(re.search(r'width="(\d+)"', chart).group(1))
    found = re.findall(
        r'<text x="([\d.]+)" y="[\d.]+" font-size="10" text-anchor="(\w+)" '
        r'fill="#666">([^<]+)</text>',
        chart,
    )
    labels = {label: (float(x), anchor) for x, anchor, label in found}
    x, anchor = labels["now"]
    assert anchor == "end" and x <= width  # the text ends at x: inside the picture
    x, anchor = labels["-60 min"]
    assert anchor == "start" and x >= 0


def test_schedules_say_their_state_in_words_with_the_job_under_the_name(admin_client_):
    from django_jobs.models import Schedule

    Schedule.objects.create(name="nightly", cron="0 3 * * *", job_name="tests.noop")
    Schedule.objects.create(name="hourly", cron="0 * * * *", job_name="tests.noop", enabled=False)
    Schedule.objects.create(name="gone", every=60, job_name="tests.gone", declared=False)
    response = admin_client_.get(url("schedule_changelist"))
    text = content_main(response).replace("<wbr>", "")
    assert response.context["cl"].list_display == [
        "action_checkbox",
        "name_cell",
        "when",
        "state",
        "next_run",
        "last_run",
    ]
    assert "icon-no" not in text and "icon-yes" not in text
    assert '<strong class="django-jobs-paused">disabled</strong>' in text
    assert ">not declared</span>" in text and ">enabled<" in text
    assert 'nightly<br><span class="django-jobs-quiet">tests.noop</span>' in text
