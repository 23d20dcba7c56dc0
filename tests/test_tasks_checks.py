"""JobsBackend.check(): misconfiguration of TASKS reported as system-check messages."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("django.tasks", reason="django.tasks needs Django >= 6.0")

from django.core.checks import run_checks
from django.db import connections
from django.tasks import task_backends
from django.test import override_settings

pytestmark = pytest.mark.django_db(databases=["default", "other", "jobs2"])

BACKEND = "django_jobs.backend.JobsBackend"


def _ids(**params):
    setting = {"default": {"BACKEND": BACKEND, **params}}
    with override_settings(TASKS=setting):
        return {m.id for m in run_checks() if m.id.startswith("django_jobs")}


def test_the_test_settings_are_clean():
    assert task_backends["default"].check() == []
    assert not {m.id for m in run_checks() if m.id.startswith("django_jobs")}


@pytest.mark.parametrize(
    ("params", "check_id"),
    [
        ({"OPTIONS": []}, "django_jobs.E102"),
        ({"OPTIONS": {"MAX_ATTEMTPS": 3}}, "django_jobs.E102"),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "django_jobs.E103"),
        ({"OPTIONS": {"BACKOFF": {"kind": "sometimes"}}}, "django_jobs.E103"),
        ({"OPTIONS": {"TIMEOUT": -1}}, "django_jobs.E103"),
        ({"OPTIONS": {"TASKS": ["shop.tasks.x"]}}, "django_jobs.E104"),
        ({"OPTIONS": {"TASKS": {"shop.tasks.x": 3}}}, "django_jobs.E104"),
        ({"OPTIONS": {"TASKS": {"shop.tasks.x": {"retries": 3}}}}, "django_jobs.E104"),
        ({"OPTIONS": {"TASKS": {"shop.tasks.x": {"max_attempts": -1}}}}, "django_jobs.E104"),
        ({"OPTIONS": {"TASKS": {"shop.tasks.x": {"atomic": "yes"}}}}, "django_jobs.E104"),
        ({"QUEUES": ["default", "bad queue"]}, "django_jobs.E105"),
    ],
)
def test_bad_options_and_queues_are_reported(params, check_id):
    assert check_id in _ids(**params)


def test_queues_must_be_allowed_by_django_jobs_queues():
    with override_settings(DJANGO_JOBS={"QUEUES": ["default"]}):
        assert "django_jobs.E105" in _ids(QUEUES=["default", "emails"])
        assert "django_jobs.E105" not in _ids(QUEUES=["default"])


def test_a_database_without_skip_locked_is_reported(monkeypatch):
    connection = connections["default"]
    monkeypatch.setattr(connection, "vendor", "oracle-like")
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    # The engine is picked by vendor at an alias's first use: pick it again for this one.
    monkeypatch.setattr(importlib.import_module("django_jobs.store.engine"), "_ENGINES", {})
    messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["django_jobs.E106"]
    assert "SKIP LOCKED" in messages[0].msg


def test_the_app_must_be_installed(monkeypatch):
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_jobs")
    assert "django_jobs.E101" in {m.id for m in task_backends["default"].check()}
