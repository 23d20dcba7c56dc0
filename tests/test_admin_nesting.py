"""Deep nesting never switches masking off: enqueue refuses what the admin cannot mask.

limits.MAX_NESTING bounds payloads (a Task's arguments included) and handler results
(a Task's envelope included) at enqueue and at settle; the admin masks and shows values
that deep, and a hand-written row nested deeper, or not JSON at all, is not shown: the
page says why and how big it is, never its text. Seen as a view-only staff user.
"""

from __future__ import annotations

import json
from importlib.util import find_spec

import pytest
from django.db import connection

from django_jobs import enqueue, job, limits, payloads
from django_jobs.exceptions import InvalidPayload, UnstorableResult
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.testing import drain, perform
from tests.admin_fixtures import VIEW_ONLY, url
from tests.conftest import ENGINE, POSTGRES
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-Pa55"
LIMIT = limits.MAX_NESTING
# Past what json decodes (about 10,000 levels on Python 3.13): jsonb holds it (up to about
# 14,000), Django cannot read it back. SQLite's JSON_VALID check refuses it.
FAR = 11_000


def nested(depth, leaf=None):
    """A value `depth` levels deep whose innermost object holds the secret under a masked key."""
    value = leaf if leaf is not None else {"password": SECRET, "sku": "A-7"}
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_text(depth):
    """The JSON text of nested(depth), written without json (which stops near 1,000)."""
    inner = json.dumps(nested(1))
    return "[" * (depth - 1) + inner + "]" * (depth - 1)


@pytest.fixture
def viewer(login):
    return login(*VIEW_ONLY)


def write_raw(obj, column, text):
    """Write text into a column as a hand edit in psql would, past Django's encoding."""
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


def pages(client, model, obj):
    """The change page and the list of a row, each answering 200 without the secret."""
    texts = []
    for target in (url(f"{model}_change", obj.pk), url(f"{model}_changelist")):
        response = client.get(target)
        assert response.status_code == 200, target
        texts.append(response.content.decode())
        assert SECRET not in texts[-1], target
    return texts


# ---- enqueue and settle: the limit ------------------------------------------------------


def test_nesting_counts_levels_without_recursion():
    assert payloads.nesting(1) == 0
    assert payloads.nesting({"a": [1, {"b": []}]}) == 4
    assert payloads.nesting(nested(LIMIT)) == LIMIT
    assert payloads.nesting(nested(50_000)) == LIMIT + 1  # stops counting past the limit
    assert payloads.nesting(nested(50_000), limit=60_000) == 50_000


def test_enqueue_takes_a_payload_at_the_limit(viewer):
    enqueue("tests.record", nested(LIMIT))
    row = Job.objects.get()
    assert payloads.nesting(json.loads(row.payload)) == LIMIT
    (change, _listing) = pages(viewer, "job", row)
    assert "&quot;password&quot;: &quot;********&quot;" in change
    assert "A-7" in change and "Not shown" not in change


@pytest.mark.parametrize("depth", [LIMIT + 1, 900, 1_200, 3_000])
def test_enqueue_refuses_a_payload_past_the_limit_and_writes_nothing(depth):
    with pytest.raises(InvalidPayload, match=f"more than {LIMIT} levels deep"):
        enqueue("tests.record", nested(depth))
    assert not Job.objects.exists()


class Deep:
    """Written by the Unfolding encoder as a value nested past the limit."""


class Unfolding(json.JSONEncoder):
    def default(self, o):
        return nested(LIMIT + 1) if isinstance(o, Deep) else super().default(o)


def test_a_custom_encoder_is_held_to_the_limit_of_what_it_writes(settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "JSON_ENCODER": f"{__name__}.Unfolding"}
    with pytest.raises(InvalidPayload, match="levels deep"):
        enqueue("tests.record", {"deep": Deep()})
    assert not Job.objects.exists()


@job(name="tests.echo_nested")
def echo_nested(payload, ctx):
    return nested(payload["depth"])


def test_a_handler_result_past_the_limit_is_unstorable():
    assert payloads.nesting(json.loads(payloads.encode_result(nested(LIMIT)))) == LIMIT
    for depth in (LIMIT + 1, 990, 5_000):
        with pytest.raises(UnstorableResult, match=f"more than {LIMIT} levels deep"):
            payloads.encode_result(nested(depth))


def test_a_job_returning_too_deep_a_value_fails_with_the_reason():
    with pytest.raises(UnstorableResult, match="levels deep"):
        perform("tests.echo_nested", {"depth": LIMIT + 1})
    assert perform("tests.echo_nested", {"depth": LIMIT}) is not None
    enqueue("tests.echo_nested", {"depth": LIMIT + 1}, max_attempts=1)
    drain()
    letter = DeadLetter.objects.get()
    assert f"more than {LIMIT} levels deep" in letter.error
    assert not CompletionMarker.objects.exists()


@pytest.mark.skipif(find_spec("django.tasks") is None, reason="django.tasks needs Django >= 6.0")
def test_a_task_result_is_held_to_the_limit_with_its_envelope():
    from tests.testapp.tasks import echo

    # The payload {"args": [x], "kwargs": {}} is two levels; the result
    # {"return_value": {"args": [x], ...}} three: x may nest LIMIT - 3 levels.
    with pytest.raises(InvalidPayload, match="levels deep"):
        echo.enqueue(nested(LIMIT - 1))
    fits = echo.enqueue(nested(LIMIT - 3))
    past = echo.enqueue(nested(LIMIT - 2))
    drain(run_scheduled=True)
    assert CompletionMarker.objects.filter(job_id=fits.id).exists()
    assert not CompletionMarker.objects.filter(job_id=past.id).exists()
    letter = DeadLetter.objects.get(id=past.id)
    assert f"more than {LIMIT} levels deep" in letter.error


# ---- hand-written rows past the limit: shown as not shown -----------------------------


@pytest.mark.parametrize("depth", [LIMIT, LIMIT + 1, 950, FAR])
@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_a_hand_written_payload_is_masked_or_not_shown(viewer, model, depth):
    obj = JobFactory() if model == "job" else DeadLetterFactory()
    text = deep_text(depth)
    write_raw(obj, "payload", text)
    change, _listing = pages(viewer, model, obj)
    if depth <= LIMIT:
        assert "&quot;password&quot;: &quot;********&quot;" in change
    else:
        assert "Not shown, as its secrets cannot be masked" in change
        assert f"({len(text):,} characters)" in change


@pytest.mark.parametrize("model", ["job", "deadletter"])
@pytest.mark.parametrize(
    "text",
    [f"password={SECRET}", f'{{"password": "{SECRET}"', f"{{'password': '{SECRET}'}}"],
    ids=["plain", "cut", "python"],
)
def test_a_payload_that_is_not_json_is_not_shown(viewer, model, text):
    obj = JobFactory() if model == "job" else DeadLetterFactory()
    write_raw(obj, "payload", text)
    change, _listing = pages(viewer, model, obj)
    assert "Not shown, as its secrets cannot be masked: not valid JSON" in change
    assert f"({len(text):,} characters)" in change


def json_depths():
    # The JSON_VALID checks refuse deeper JSON: MariaDB's past 32 levels, SQLite's past 2,000.
    if ENGINE == "mariadb":
        return [LIMIT]
    return [LIMIT, LIMIT + 1, 950, FAR if POSTGRES else 1_500]


@pytest.mark.parametrize("depth", json_depths())
def test_a_hand_written_marker_result_is_masked_or_not_shown(viewer, depth):
    marker = MarkerFactory()
    write_raw(marker, "result", deep_text(depth))
    change, _listing = pages(viewer, "completionmarker", marker)
    if depth <= LIMIT:
        assert "&quot;password&quot;: &quot;********&quot;" in change
    else:
        assert "Not shown, as its secrets cannot be masked" in change
        assert "nested more than" in change


@pytest.mark.parametrize("depth", json_depths())
@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_hand_written_errors_are_masked_or_not_shown(viewer, model, depth):
    obj = JobFactory() if model == "job" else DeadLetterFactory()
    # The list, the entry, then the message: `depth` levels in all.
    text = '[{"attempt": 1, "type": "builtins.RuntimeError", "message": '
    text += deep_text(depth - 2) + "}]"
    write_raw(obj, "errors", text)
    change, _listing = pages(viewer, model, obj)
    if depth <= LIMIT:
        assert "&quot;password&quot;: &quot;********&quot;" in change
    else:
        assert "not shown, as its secrets cannot be masked" in change.lower()


@pytest.mark.parametrize("model", ["job", "deadletter"])
def test_odd_error_entries_are_masked(viewer, model):
    obj = JobFactory() if model == "job" else DeadLetterFactory()
    errors = [
        {"attempt": 1, "message": {"password": SECRET}, "traceback": [{"token": SECRET}]},
        [{"password": SECRET}],  # not an entry at all
        {"attempt": {"secret": SECRET}, "worker": {"token": SECRET}, "at": ["2024"]},
    ]
    write_raw(obj, "errors", json.dumps(errors))
    change, _listing = pages(viewer, model, obj)
    assert change.count("********") >= 4


@pytest.mark.skipif(ENGINE == "mariadb", reason="not on MariaDB: its JSON columns refuse it")
def test_running_jobs_with_errors_past_what_json_reads_are_listed(admin_client_):
    running = JobFactory(leased=True)
    depth = FAR if POSTGRES else 1_500
    write_raw(running, "errors", "[" * depth + "]" * depth)
    listed = admin_client_.get(url("runningjob_changelist"))
    assert listed.status_code == 200
    assert url("runningjob_change", running.pk) in listed.text
    assert admin_client_.get(url("runningjob_change", running.pk)).status_code == 200
