"""Hostile query strings and hand-edited rows: every page of ours answers, never a 500."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_jobs.models import QueueState, Schedule
from tests.admin_fixtures import url
from tests.conftest import ENGINE, POSTGRES
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory, WorkerBeatFactory

pytestmark = pytest.mark.django_db

CHANGELISTS = [
    "deadletter",
    "job",
    "completionmarker",
    "schedule",
    "queuestate",
    "workerbeat",
    "runningjob",
]

# Query strings as typed (or forged) in the address bar, percent-encoded as sent.
HOSTILE = [
    "queue=%00",
    "name=%00",
    "reason=%00",
    "state=%00",
    "replayed=%00",
    "q=%00",
    "q=a%00b",
    "q=%ED%A0%80",  # a lone surrogate, UTF-8-encoded as some clients do
    "q=" + "x" * 20_000,
    "dead_at__year=9999",
    "dead_at__year=9999&dead_at__month=12",
    "dead_at__year=9999&dead_at__month=12&dead_at__day=31",
    "dead_at__year=0",
    "dead_at__year=99999999999999999999",
    "dead_at__year=2024&dead_at__month=13",
    "dead_at__year=2024&dead_at__month=2&dead_at__day=30",
    "dead_at__year=%00",
    "dead_at__range__gte_0=2024-02-30&dead_at__range__gte_1=",
    "dead_at__range__gte_0=9999-12-31&dead_at__range__lte_0=9999-12-31",
    "dead_at__range__gte_0=%00&dead_at__range__lte_0=%00",
    "dead_at__range__gte_0=0001-01-01&dead_at__range__lte_0=0001-01-01",
    "enqueued_at__range__gte_0=2024-01-01&enqueued_at__range__gte_1=25:00",
    "completed_at__range__gte_0=99999-01-01",
    "dead_at__range__gte=2024-02-30",
    "dead_at__range__gte=9999-12-31&dead_at__range__lte=9999-12-31",
    "dead_at__range__gte=0001-01-01&dead_at__range__lte=0001-01-01",
    "dead_at__range__gte=%00",
    "enqueued_at__range__lte=99999-01-01",
    "completed_at__range__gte=0001-01-01&completed_at__range__lte=0001-01-01",
    "completed_at__range__lte=9999-12-31",
    "completed_at__range__gte_0=0001-01-01&completed_at__range__lte_0=0001-01-01",
    "p=99999999999999999999",
    "p=-1",
    "p=%00",
    "o=99",
    "o=1.%00",
    "o=-",
    "e=1",
    "_to_field=payload",
    "id__exact=%00",
    "paused__exact=%00",
    "enabled__exact=%00",
    "declared__exact=maybe",
    "reason__exact=%00",
    "queue=%00&name=%00&q=%00&p=%00",
]


@pytest.fixture
def rows():
    JobFactory()
    JobFactory(leased=True, worker="h:1:aa")
    DeadLetterFactory()
    MarkerFactory()
    QueueState.objects.ensure(["default"])
    Schedule.objects.create(name="nightly", cron="0 3 * * *", job_name="tests.noop")
    WorkerBeatFactory(id="h:1:aa", pid=1, concurrency=1)


def assert_answers(client, path):
    """GET path; a redirect (Django's ?e=1 for a bad filter) is followed. No 500, no traceback."""
    response = client.get(path)
    hops = 0
    while response.status_code in (301, 302) and hops < 3:
        response = client.get(response["Location"])
        hops += 1
    assert response.status_code in (200, 400, 403), (path, response.status_code)
    return response


@pytest.mark.parametrize("model", CHANGELISTS)
@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_query_strings_on_every_changelist(admin_client_, rows, model, query):
    assert_answers(admin_client_, f"{url(model + '_changelist')}?{query}")


@pytest.mark.parametrize("query", ["queue=%00", "p=%00", "x=%00"])
def test_hostile_query_strings_on_the_dashboard(admin_client_, rows, query):
    assert_answers(admin_client_, f"{url('dashboard')}?{query}")


@pytest.mark.parametrize("model", CHANGELISTS)
@pytest.mark.parametrize("pk", ["%00", "a%00b", "%ED%A0%80", "x" * 5000, "0"])
@pytest.mark.parametrize("view", ["change", "history", "delete"])
def test_hostile_object_ids(admin_client_, rows, model, pk, view):
    assert_answers(admin_client_, f"/admin/django_jobs/{model}/{pk}/{view}/")


def test_nul_in_a_filter_answers_400(admin_client_, rows):
    response = admin_client_.get(url("deadletter_changelist") + "?queue=%00")
    assert response.status_code == 400
    assert b"NUL" in response.content


def test_a_date_hierarchy_past_year_9999_is_ignored(admin_client_, rows):
    response = admin_client_.get(url("deadletter_changelist") + "?dead_at__year=9999")
    assert response.status_code in (200, 302)


# ---- hand-edited rows --------------------------------------------------------------------

MB10 = 10 * 1024 * 1024
# Bytes a detail or list page may take, whatever a row holds (a 10 MB error once made 21 MB).
PAGE_LIMIT = 1024 * 1024

TEXTS = {  # for payload, error and traceback columns (text)
    "escaped surrogate": '"\\ud800"',
    "escaped surrogate key and NUL": '{"\\ud800": "\\udfff\\u0000", "password": "\\ud800"}',
    "malformed JSON": '{"a": ',
    "nested too deep": "[" * 100_000,
    "10 MB": '{"s": "' + "x" * MB10 + '"}',
    "10 MB one line": "E" * MB10,
    "raw NUL": "a\x00b",  # SQLite only: PostgreSQL text refuses it
}
JSONS = {  # for errors, result, queues and stats columns (json / jsonb)
    "list of ints": "[1, 2]",
    "string": '"text"',
    "number": "5",
    "object": '{"a": 1}',
    "null": "null",
    "odd entry": '[{"attempt": {"x": 1}, "at": "2024-02-30T10:00:00", "message": ["a"], '
    '"type": null, "worker": 5}, {"at": 5, "traceback": 7}, "text", null]',
    "10,000 attempts": json.dumps(
        [{"attempt": i, "message": "m", "traceback": "t" * 100} for i in range(10_000)]
    ),
    "10 MB message": json.dumps([{"message": "x" * MB10, "traceback": "y" * MB10}]),
    "10 MB string": json.dumps("z" * MB10),
    "escaped surrogates": '[{"message": "\\ud800", "traceback": "\\udc00", "at": "\\ud800"}]',
}
# Malformed JSON text cannot reach a JSON column: jsonb and SQLite's JSON_VALID check refuse it.
SQLITE_ONLY = {"raw NUL", "escaped surrogates", "malformed JSON"}  # PostgreSQL refuses these
# MariaDB's json_valid check refuses lone surrogates, and a 20 MB statement is more than
# its default max_allowed_packet (16 MB).
NOT_MARIADB = {"escaped surrogates", "10 MB message"}

COLUMNS = [
    ("deadletter", "payload", TEXTS),
    ("deadletter", "error", TEXTS),
    ("deadletter", "traceback", TEXTS),
    ("deadletter", "errors", JSONS),
    ("job", "payload", TEXTS),
    ("job", "errors", JSONS),
    ("completionmarker", "result", JSONS),
    ("workerbeat", "queues", JSONS),
    ("workerbeat", "stats", JSONS),
    ("schedule", "payload", TEXTS),
]
CASES = [
    pytest.param(model, column, name, values[name], id=f"{model}.{column}-{name}")
    for model, column, values in COLUMNS
    for name in values
    if not (POSTGRES and name in SQLITE_ONLY) and not (ENGINE == "mariadb" and name in NOT_MARIADB)
]


def _row(model):
    if model == "deadletter":
        return DeadLetterFactory()
    if model == "job":
        return JobFactory()
    if model == "completionmarker":
        return MarkerFactory()
    if model == "workerbeat":
        return WorkerBeatFactory(id="h:1:aa", pid=1, concurrency=1)
    return Schedule.objects.create(name="nightly", cron="0 3 * * *", job_name="tests.noop")


def _write_raw(obj, column, text):
    """Write text into a column as a hand-edit in psql would, past Django's encoding."""
    meta = type(obj)._meta
    field = meta.get_field(column)
    cast = "::jsonb" if POSTGRES and field.get_internal_type() == "JSONField" else ""
    pk = meta.pk.get_db_prep_value(obj.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {meta.db_table} SET {field.column} = %s{cast} "  # noqa: S608 - our names
            f"WHERE {meta.pk.column} = %s",
            [text, pk],
        )


@pytest.mark.parametrize(("model", "column", "name", "text"), CASES)
def test_hand_edited_rows_render_bounded_pages(admin_client_, model, column, name, text):
    obj = _row(model)
    _write_raw(obj, column, text)

    changelist = admin_client_.get(url(f"{model}_changelist"))
    assert changelist.status_code == 200
    assert len(changelist.content) < PAGE_LIMIT
    detail = admin_client_.get(url(f"{model}_change", obj.pk))
    assert detail.status_code == 200
    assert len(detail.content) < PAGE_LIMIT, len(detail.content)
    page = detail.content.decode()
    if "surrogate" in name:
        assert "\\ud800" in page  # shown as its escape, not dropped
    if column == "payload" and name in {"10 MB one line", "malformed JSON", "nested too deep"}:
        assert "Not shown, as its secrets cannot be masked" in page  # not JSON: may hold any
    elif name.startswith("10 MB") and column != "queues":  # a worker's queues: one cut line
        assert "characters are shown" in page  # cut, and says so


def test_a_lone_surrogate_in_a_payload_is_shown_escaped_and_masked_keys_stay_masked(
    admin_client_,
):
    letter = DeadLetterFactory()
    _write_raw(letter, "payload", '{"note": "a\\ud800b", "password": "hunter2"}')
    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert "&quot;note&quot;: &quot;a\\ud800b&quot;" in text
    assert "hunter2" not in text


def test_a_10_mb_error_is_cut_on_the_list_and_the_page_with_a_note(admin_client_):
    letter = DeadLetterFactory(error="builtins.ValueError: " + "x" * MB10)
    listed = admin_client_.get(url("deadletter_changelist")).content.decode()
    assert len(listed) < 200_000
    assert "builtins.ValueError: xxx" in listed and "…" in listed
    page = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert len(page) < PAGE_LIMIT
    assert f"Cut: the first 65,536 of {MB10 + 21:,} characters are shown." in page


# Bidirectional controls (names and keys refuse them) and terminal control characters.
INVISIBLE = ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200f", "\u061c"]
CONTROLS = ["\x1b", "\x07", "\x7f", "\x85", "\x9b"]


@pytest.mark.parametrize("char", INVISIBLE + CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_bidi_and_control_characters_show_escaped_in_values_and_errors(admin_client_, char):
    text = f"invoice{char}fdp.exe"
    letter = DeadLetterFactory(
        payload=json.dumps({"file": text}, ensure_ascii=False),
        error=f"builtins.ValueError: {text}",
        traceback=f"Traceback (most recent call last):\n  {text}\nValueError: {text}",
        errors=[{"attempt": 1, "message": text, "worker": text, "traceback": text}],
    )
    job = JobFactory(payload=json.dumps({"file": text}), errors=[{"message": text}])
    marker = MarkerFactory(result={"file": text})
    escaped = f"\\u{ord(char):04x}"
    for page in (
        admin_client_.get(url("deadletter_changelist")),
        admin_client_.get(url("deadletter_change", letter.pk)),
        admin_client_.get(url("job_change", job.pk)),
        admin_client_.get(url("completionmarker_change", marker.pk)),
    ):
        body = page.content.decode()
        assert char not in body
        assert f"invoice{escaped}fdp" in body  # the list breaks lines after the dots
