"""pytest fixtures for testing code that uses django-jobs.

Loaded by pytest through the ``pytest11`` entry point. Opt-in, like pytest-django's
fixtures: nothing here runs unless a test asks for a fixture by name.

    def test_order_sends_a_confirmation(client, jobs):
        client.post("/orders/", {"item": "book"})
        jobs.assert_enqueued("shop.jobs.send_confirmation")
        assert len(jobs.drain().succeeded) == 4
"""

from __future__ import annotations

from typing import Any

import pytest


def _database_access(request: pytest.FixtureRequest) -> None:
    # With pytest-django, asking for a fixture is enough (its `db`, in a test
    # transaction unless the test is marked transaction=True).
    if request.config.pluginmanager.hasplugin("django"):
        request.getfixturevalue("db")


@pytest.fixture
def jobs(request: pytest.FixtureRequest) -> Any:
    """django_jobs.testing: drain, perform, assert_enqueued, assert_not_enqueued, enqueued_jobs."""
    _database_access(request)
    from django_jobs import testing

    return testing


@pytest.fixture
def jobs_drain(jobs: Any) -> Any:
    """django_jobs.testing.drain: run the due jobs through the worker's code, in this thread."""
    return jobs.drain
