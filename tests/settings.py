"""Settings of the test project: PostgreSQL by default, SQLite with TEST_DB=sqlite."""

import json
import os

SECRET_KEY = "django-jobs-tests"  # noqa: S105
# Worker subprocesses of the chaos tests run with DEBUG on, or a short CONN_MAX_AGE, on request.
DEBUG = os.environ.get("JOBS_DEBUG") == "1"
USE_TZ = True
TIME_ZONE = "UTC"


def _sqlite(name: str, test_name: str, env: str) -> dict:
    """A SQLite file database set up for concurrent workers (TEST_DB=sqlite)."""
    here = os.path.dirname(__file__)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        # A file, not :memory:, so that worker subprocesses and threads share it.
        "NAME": os.environ.get(env, os.path.join(here, name)),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": os.environ.get(env, os.path.join(here, test_name))},
    }


if os.environ.get("TEST_DB", "postgres") == "sqlite":
    DATABASES = {
        "default": _sqlite("db.sqlite3", "test_db.sqlite3", "TEST_DB_NAME"),
        # A second database, for jobs tied to the commit of another alias.
        "other": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(os.path.dirname(__file__), "other.sqlite3"),
            "TEST": {"NAME": os.path.join(os.path.dirname(__file__), "test_other.sqlite3")},
        },
        # A second job database (docs/scaling.md): tests that ask for it list it in
        # DJANGO_JOBS["DATABASES"] (tests/conftest.py's two_job_databases).
        "jobs2": _sqlite("jobs2.sqlite3", "test_jobs2.sqlite3", "TEST_JOBS2_DB_NAME"),
    }
elif os.environ.get("TEST_DB") == "mariadb":
    # MariaDB 10.6+ through mysqlclient (python3 dev.py test-mariadb).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "NAME": os.environ.get("TEST_DB_NAME", os.environ.get("JOBS_TEST_DB", "django_jobs")),
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
            "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"},
        }
    }
    DATABASES["other"] = {
        **DATABASES["default"],
        # In worker subprocesses, the test database of "other" (MySQL checks connect to
        # it), or default's when the run made none (tests/conftest.py's worker_process).
        "NAME": os.environ.get("TEST_OTHER_DB_NAME", DATABASES["default"]["NAME"] + "_other"),
    }
    DATABASES["jobs2"] = {
        **DATABASES["default"],
        "NAME": os.environ.get("TEST_JOBS2_DB_NAME", DATABASES["default"]["NAME"] + "_jobs2"),
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            # pytest-django makes "test_" + NAME;
            # JOBS_TEST_DB lets parallel checkouts use their own.
            # Worker subprocesses get the name of the test database itself in TEST_DB_NAME.
            "NAME": os.environ.get("TEST_DB_NAME", os.environ.get("JOBS_TEST_DB", "django_jobs")),
            "CONN_MAX_AGE": int(os.environ.get("JOBS_CONN_MAX_AGE", "0")),
        }
    }
    if os.environ.get("JOBS_PGBOUNCER") == "1":
        # Through PgBouncer in transaction pooling (dev.py's pgbouncer run, PGPORT=6432):
        # no server-side cursors, which live in a session the pooler does not keep.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["other"] = {
        **DATABASES["default"],
        "NAME": os.environ.get("JOBS_TEST_DB", "django_jobs") + "_other",
    }
    # A second job database on a second PostgreSQL server (dev.py starts the cluster
    # "jobs2" on port 5433): tests that ask for it list it in DJANGO_JOBS["DATABASES"].
    DATABASES["jobs2"] = {
        **DATABASES["default"],
        "HOST": os.environ.get("JOBS2_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("JOBS2_PGPORT", "5433"),
        "NAME": os.environ.get(
            "TEST_JOBS2_DB_NAME", os.environ.get("JOBS_TEST_DB", "django_jobs") + "_jobs2"
        ),
    }
    DATABASES["jobs2"].pop("DISABLE_SERVER_SIDE_CURSORS", None)  # not behind PgBouncer

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rangefilter",
    "django_jobs",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DJANGO_JOBS = {
    "BACKOFF": {"kind": "fixed", "base": 0.0, "ceiling": 0.0, "jitter": 0.0},
    "POLL_INTERVAL": 0.2,
}
if os.environ.get("JOBS_PGBOUNCER") == "1":
    # What the README asks of sites behind a transaction pooler.
    DJANGO_JOBS.update({"POOLER": "transaction", "LISTEN": False, "PREPARED_STATEMENTS": False})
# Worker subprocesses of the rolling-deploy tests run "the previous release": without
# the handlers tests/testapp/jobs.py adds in the next one.
JOBS_TEST_OLD_RELEASE = os.environ.get("JOBS_TEST_OLD_RELEASE") == "1"
# Worker subprocesses of a test get extra DJANGO_JOBS keys (schedules, intervals) as JSON.
DJANGO_JOBS.update(json.loads(os.environ.get("JOBS_TEST_SETTINGS", "{}")))
# Worker subprocesses of the tracing tests export their spans to this file (tests/otel.py).
if os.environ.get("JOBS_TEST_SPANS"):
    from tests import otel

    otel.configure(os.environ["JOBS_TEST_SPANS"])

# Django's Tasks framework (Django >= 6.0; ignored before): @task functions of
# tests/testapp/tasks.py run on django-jobs. "immediate" is a backend that is not
# ours: its tasks must never run on the worker.
TASKS = {
    "default": {
        "BACKEND": "django_jobs.backend.JobsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 3,
            "TASKS": {"tests.testapp.tasks.explode": {"max_attempts": 2}},
        },
    },
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_jobs": {
            "handlers": ["stderr"],
            "level": os.environ.get("JOBS_LOG_LEVEL", "WARNING"),
        }
    },
}
