"""PgBouncer in transaction pooling: the system check of DJANGO_JOBS["POOLER"], and proof that
dev.py's pgbouncer run really goes through a transaction pooler."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings

from tests.conftest import PGBOUNCER

POOLED = {"POOLER": "transaction", "LISTEN": False, "PREPARED_STATEMENTS": False}


def _messages(**jobs_settings):
    with override_settings(DJANGO_JOBS=jobs_settings):
        return {m.id: m for m in run_checks() if m.id.startswith("django_jobs")}


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize(
    ("jobs_settings", "named"),
    [
        ({"POOLER": "transaction"}, ["LISTEN", "PREPARED_STATEMENTS"]),
        ({**POOLED, "LISTEN": True}, ["LISTEN"]),
        ({**POOLED, "PREPARED_STATEMENTS": True}, ["PREPARED_STATEMENTS"]),
    ],
)
def test_a_transaction_pooler_with_listen_or_prepared_statements_is_warned(jobs_settings, named):
    warning = _messages(**jobs_settings)["django_jobs.W202"]
    assert "'transaction'" in warning.msg
    for key in {"LISTEN", "PREPARED_STATEMENTS"}:
        assert (f"DJANGO_JOBS['{key}'] = False" in warning.hint) is (key in named)


@pytest.mark.django_db(databases=["default", "other"])
def test_psycopg_prepared_statements_behind_a_transaction_pooler_are_warned(monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "prepare_threshold", 5)
    warning = _messages(**POOLED)["django_jobs.W202"]
    assert warning.hint.count(" = ") == 1
    assert "DATABASES['default']['OPTIONS']['prepare_threshold'] = None" in warning.hint


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize(
    "jobs_settings",
    [POOLED, {}, {"POOLER": None, "LISTEN": True}],
    ids=["pooled", "default", "no-pooler"],
)
def test_no_warning_without_a_pooler_or_with_both_off(jobs_settings):
    assert _messages(**jobs_settings) == {}


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize("pooler", ["session", "TRANSACTION", True, 1, ""])
def test_an_unknown_pooler_is_an_error(pooler):
    messages = _messages(POOLER=pooler)
    assert "django_jobs.E210" in messages
    assert "django_jobs.W202" not in messages


@pytest.mark.pgbouncer
@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.skipif(not PGBOUNCER, reason="runs in dev.py's pgbouncer run only (JOBS_PGBOUNCER=1)")
def test_this_run_goes_through_pgbouncer_in_transaction_pooling(settings):
    assert settings.DJANGO_JOBS["POOLER"] == "transaction"
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port()")
        server_port = cursor.fetchone()[0]
    assert int(connection.settings_dict["PORT"]) != server_port, "no pooler in between"
    console = psycopg.connect(
        host=connection.settings_dict["HOST"],
        port=connection.settings_dict["PORT"],
        user=connection.settings_dict["USER"],
        dbname="pgbouncer",
        autocommit=True,
        cursor_factory=psycopg.ClientCursor,  # the admin console speaks the simple protocol only
    )
    with console:
        rows = console.execute("SHOW CONFIG").fetchall()
    pool_mode = next(row[1] for row in rows if row[0] == "pool_mode")
    assert pool_mode == "transaction"
    assert os.environ.get("JOBS_PGBOUNCER") == "1"


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize("claim", ["ORM", "sql", None, ["orm"], "x" * 10_000])
def test_an_unknown_claim_is_an_error(claim):
    assert "django_jobs.E211" in _messages(CLAIM=claim)


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize("claim", ["auto", "orm"])
def test_both_claims_are_accepted(claim):
    assert _messages(CLAIM=claim) == {}
