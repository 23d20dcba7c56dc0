"""System checks, the runjobs command line, the router, migrations, the public API."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.test import override_settings

import django_jobs
from django_jobs.routers import JobsRouter
from tests.conftest import POSTGRES
from tests.factories import JobFactory

# Model checks ask SQLite whether it has JSON1, which needs the database (each of them).
pytestmark = pytest.mark.django_db(databases=["default", "other", "jobs2"])


def _ids(**jobs_settings):
    with override_settings(DJANGO_JOBS=jobs_settings):
        return {message.id for message in run_checks() if message.id.startswith("django_jobs")}


def test_default_configuration_is_clean():
    assert _ids() == set()


@pytest.mark.parametrize(
    ("settings", "check_id"),
    [
        ({"CONCURENCY": 3}, "django_jobs.E002"),
        ({"DATABASE": "nope"}, "django_jobs.E003"),
        ({"CONCURRENCY": 0}, "django_jobs.E004"),
        ({"ASYNC_CONCURRENCY": 10_001}, "django_jobs.E004"),
        ({"BATCH": "10"}, "django_jobs.E004"),
        ({"LEASE": -1}, "django_jobs.E005"),
        ({"TIMEOUT": 0}, "django_jobs.E006"),
        ({"HEARTBEAT": -1}, "django_jobs.E007"),
        ({"LEASE": 10, "HEARTBEAT": 10}, "django_jobs.E008"),
        ({"BACKOFF": {"kind": "sometimes"}}, "django_jobs.E009"),
        ({"QUEUES": "default"}, "django_jobs.E010"),
        ({"MAX_PAYLOAD_BYTES": 0}, "django_jobs.E011"),
        ({"HEARTBEAT": 0, "TIMEOUT": 60, "LEASE": 30}, "django_jobs.W001"),
        ({"DATABASE": "other"}, "django_jobs.W003"),
        # Operations: retention, maintenance, heartbeat expiry, the metrics token.
        ({"KEEP_MARKERS": "soon"}, "django_jobs.E203"),
        ({"KEEP_DEAD_LETTERS": -1}, "django_jobs.E203"),
        ({"PRUNE_BATCH": 0}, "django_jobs.E204"),
        ({"MAINTENANCE_INTERVAL": 0}, "django_jobs.E205"),
        ({"MAINTENANCE_INTERVAL": 30, "WORKER_EXPIRY": 40}, "django_jobs.E206"),
        ({"METRICS_TOKEN": "short"}, "django_jobs.E209"),
    ],
)
def test_checks_report_misconfiguration(settings, check_id):
    assert check_id in _ids(**settings)


@pytest.mark.postgres
def test_autovacuum_check_follows_the_server_setting():
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        on = cursor.fetchone()[0] == "on"
    ids = {m.id for m in run_checks(databases=["default"])}
    assert ("django_jobs.W201" in ids) is (not on)


def test_postgres_flag_matches_the_database():
    assert POSTGRES is (connection.vendor == "postgresql")


def test_router_sends_the_tables_to_the_jobs_database():
    from django_jobs.models import Job

    router = JobsRouter()
    with override_settings(DJANGO_JOBS={"DATABASE": "other"}):
        assert router.db_for_write(Job) == "other"
        assert router.allow_migrate("other", "django_jobs") is True
        assert router.allow_migrate("default", "django_jobs") is False
        assert router.allow_migrate("default", "auth") is None


def test_managers_default_to_the_jobs_database():
    from django_jobs.models import CompletionMarker, DeadLetter, Job

    with override_settings(DJANGO_JOBS={"DATABASE": "other"}):
        assert Job.objects.all().db == "other"
        assert CompletionMarker.objects.all().db == "other"
        assert DeadLetter.objects.all().db == "other"
    assert Job.objects.all().db == "default"


@pytest.mark.parametrize(
    "argv",
    [
        ["--concurrency", "0"],
        ["--concurrency", "many"],
        ["--batch", "-1"],
        ["--lease", "0"],
        ["--lease", "inf"],
        ["--queue", "bad queue"],
        ["--max-jobs", "1.5"],
        ["--poll-interval", "soon"],
    ],
)
def test_runjobs_refuses_bad_options(argv):
    with pytest.raises(CommandError, match=f"argument {argv[0]}"):  # refused for this option
        call_command("runjobs", *argv)


def test_runjobs_refuses_a_heartbeat_as_long_as_the_lease():
    with pytest.raises(CommandError, match="heartbeat"):
        call_command("runjobs", "--lease", "5", "--heartbeat", "5")


def test_migrations_match_the_models():
    call_command("makemigrations", "django_jobs", "--check", "--dry-run", verbosity=0)


def test_no_warnings_about_our_partial_indexes():
    # On MariaDB, migration 0004's plain unique index stands in for the partial one.
    messages = run_checks(databases=["default", "other"])
    ours = [m for m in messages if m.id in ("models.W036", "models.W037")]
    assert ours == []


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's stand-in for a partial index")
def test_one_live_job_per_key_is_the_database_rule_on_mariadb():
    JobFactory(key=None)
    JobFactory(key=None)  # NULL never collides
    JobFactory(key="k")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(key="k")


def test_public_api():
    for name in django_jobs.__all__:
        assert getattr(django_jobs, name) is not None
    from django_jobs.api import enqueue

    assert django_jobs.enqueue is enqueue
    with pytest.raises(AttributeError):
        django_jobs.nothing_here  # noqa: B018
