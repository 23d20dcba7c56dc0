"""MASK_KEYS: secrets in payloads and results are masked in the admin; the setting is checked."""

from __future__ import annotations

import json

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from tests.admin_fixtures import url
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db(databases=["default", "other", "jobs2"])

PAYLOAD = json.dumps(
    {"card": "4242 4242", "Password": "hunter2", "items": [{"token": "t-1", "sku": "A-7"}]}
)


def test_default_keys_are_masked_at_any_depth_and_in_any_case(admin_client_):
    letter = DeadLetterFactory(payload=PAYLOAD)
    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert "hunter2" not in text and "t-1" not in text
    assert "4242 4242" in text and "A-7" in text  # not a configured key


def test_the_setting_replaces_the_list(admin_client_, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "MASK_KEYS": ["card"]}
    job = JobFactory(payload=PAYLOAD)
    text = admin_client_.get(url("job_change", job.pk)).content.decode()
    assert "4242 4242" not in text and "&quot;card&quot;: &quot;********&quot;" in text
    assert "hunter2" in text


def test_an_empty_list_masks_nothing(admin_client_, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "MASK_KEYS": []}
    letter = DeadLetterFactory(payload=PAYLOAD)
    assert "hunter2" in admin_client_.get(url("deadletter_change", letter.pk)).content.decode()


@pytest.mark.parametrize("value", ["password", [1, 2], ["ok", ""], {"password": True}])
def test_a_malformed_setting_is_reported(value):
    with override_settings(DJANGO_JOBS={"MASK_KEYS": value}):
        ids = {m.id for m in run_checks() if m.id.startswith("django_jobs")}
    assert "django_jobs.E013" in ids


def test_a_list_of_names_passes_the_check():
    with override_settings(DJANGO_JOBS={"MASK_KEYS": ["password", "card_number"]}):
        assert not [m for m in run_checks() if m.id.startswith("django_jobs")]
