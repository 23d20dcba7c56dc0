"""What a new user is told when a call cannot work: undeclared queues, unknown names, models."""

from __future__ import annotations

import json
import logging

import pytest
from django.core.management import call_command

from django_jobs import api, enqueue

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(api, "_warned", set())


def _queue_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "django_jobs.api"]


def test_enqueue_on_an_undeclared_queue_warns_once_in_debug(settings, caplog, fresh_warnings):
    settings.DEBUG = True
    with caplog.at_level(logging.WARNING, logger="django_jobs.api"):
        enqueue("tests.noop", {}, queue="nobody")
        enqueue("tests.noop", {}, queue="nobody")
        enqueue("tests.noop", {}, queue="emails")  # tests.other_queue declares it
        enqueue("tests.noop", {}, queue="default")
    assert _queue_warnings(caplog) == [
        "queue 'nobody': no registered handler declares it, so `runjobs` does not serve it "
        "unless started with --queue nobody"
    ]


def test_enqueue_on_an_undeclared_queue_is_silent_without_debug(settings, caplog, fresh_warnings):
    settings.DEBUG = False
    with caplog.at_level(logging.WARNING, logger="django_jobs.api"):
        enqueue("tests.noop", {}, queue="nobody")
    assert _queue_warnings(caplog) == []


def test_jobs_status_flags_queues_no_handler_declares(capsys):
    enqueue("tests.noop", {}, queue="orphans")
    enqueue("tests.noop", {})
    call_command("jobs", "status")
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "no handler" in rows["orphans"]
    assert "no handler" not in rows["default"]
    assert "no handler" not in rows["emails"]
    assert "runjobs serves it only when started with --queue NAME" in out
    call_command("jobs", "status", "--json")
    queues = {q["name"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert queues["orphans"]["declared"] is False
    assert queues["default"]["declared"] is True


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("tests.nop", "'tests.noop'"),
        ("tests.recrod", "'tests.record'"),
        ("flaky", "'tests.flaky'"),
    ],
)
def test_an_unknown_name_suggests_the_closest_registered_ones(name, suggested):
    from django_jobs import UnknownJob

    with pytest.raises(UnknownJob) as caught:
        enqueue(name, {})
    message = str(caught.value)
    assert message.startswith(f"no job handler is registered under the name {name!r}; ")
    assert f"did you mean {suggested}" in message


def test_an_unknown_name_far_from_every_handler_gets_no_guess():
    from django_jobs import UnknownJob

    with pytest.raises(UnknownJob) as caught:
        enqueue("zzzzzzzz.qqqqqqq", {})
    assert str(caught.value) == "no job handler is registered under the name 'zzzzzzzz.qqqqqqq'"


def test_a_model_instance_in_a_payload_says_to_pass_its_primary_key():
    from django_jobs import InvalidPayload
    from tests.testapp.models import Audit

    audit = Audit.objects.create(label="x")
    with pytest.raises(InvalidPayload) as caught:
        enqueue("tests.noop", {"audit": audit})
    assert "Audit is a model instance: pass its primary key instead" in str(caught.value)
    assert '{"audit_id": obj.pk}' in str(caught.value)


@pytest.mark.parametrize("alias", [["default"], {"x": 1}, "nope"])
def test_first_run_checks_survive_a_bad_database_setting(settings, alias):
    from django_jobs import checks

    settings.DJANGO_JOBS = {"DATABASE": alias}
    assert checks.check_migrations(databases=["default"]) == []
    assert checks.check_sqlite() == []


def test_atomic_requests_on_an_alias_without_the_jobs_is_warned_about(settings, monkeypatch):
    from django_jobs import checks

    databases = settings.DATABASES
    monkeypatch.setitem(databases["other"], "ATOMIC_REQUESTS", True)
    [warning] = checks.check_atomic_requests()
    assert warning.id == "django_jobs.W022"
    assert "commit_of='other'" in warning.hint
    monkeypatch.setitem(databases["default"], "ATOMIC_REQUESTS", True)  # the jobs' too
    assert checks.check_atomic_requests() == []
    monkeypatch.setitem(databases["default"], "ATOMIC_REQUESTS", False)
    monkeypatch.setitem(databases["other"], "ATOMIC_REQUESTS", False)
    assert checks.check_atomic_requests() == []


def test_an_empty_registry_says_where_handlers_are_declared(monkeypatch):
    from django_jobs import UnknownJob, registry

    monkeypatch.setattr(registry, "_handlers", {})
    with pytest.raises(UnknownJob, match="no handler is registered at all: declare @job"):
        registry.get_handler("shop.jobs.send")
