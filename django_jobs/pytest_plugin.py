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


def pytest_configure(config: pytest.Config) -> None:
    # pytest-django decides at collection which test databases to create, from
    # each test's fixture closure: `jobs` must ask for its `db` in its signature
    # (a getfixturevalue at run time comes too late, and the test would run on the
    # settings' database). Without pytest-django (or with -p no:django) there is
    # no `db` to ask for, so the fixtures are registered here, one way or the other.
    fixtures = _OnTheTestDatabase() if config.pluginmanager.hasplugin("django") else _Plain()
    config.pluginmanager.register(fixtures, "django_jobs.fixtures")


def _helpers() -> Any:
    from django_jobs import testing

    return testing


class _OnTheTestDatabase:
    @pytest.fixture
    def jobs(self, db: None) -> Any:
        """django_jobs.testing (drain, perform, assert_enqueued...), on the test database.

        On pytest-django's test database: in a test transaction (`db`), unless the
        test asks for `transactional_db` or is marked django_db(transaction=True);
        a django_db mark's databases= hold as marked.
        """
        return _helpers()

    @pytest.fixture
    def jobs_drain(self, jobs: Any) -> Any:
        """django_jobs.testing.drain: run the due jobs through the worker's code, in this thread."""
        return jobs.drain


class _Plain:
    @pytest.fixture
    def jobs(self) -> Any:
        """django_jobs.testing: drain, perform, assert_enqueued, assert_not_enqueued..."""
        return _helpers()

    @pytest.fixture
    def jobs_drain(self, jobs: Any) -> Any:
        """django_jobs.testing.drain: run the due jobs through the worker's code, in this thread."""
        return jobs.drain
