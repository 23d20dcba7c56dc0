"""Example project: SQLite by default; PostgreSQL when EXAMPLE_DB=postgres (PG* variables)."""

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"  # noqa: S105
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

if os.environ.get("EXAMPLE_DB") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "NAME": os.environ.get("PGDATABASE", "django_jobs_example"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("EXAMPLE_SQLITE", str(BASE_DIR / "db.sqlite3")),
            # IMMEDIATE transactions and WAL let the web process and workers share the file.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_jobs",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

if django.VERSION >= (6, 0):
    # A strict Content-Security-Policy: no inline script or style without the page's
    # nonce, nothing from other hosts. The django-jobs admin pages need nothing more.
    from django.utils.csp import CSP

    MIDDLEWARE.append("django.middleware.csp.ContentSecurityPolicyMiddleware")
    SECURE_CSP = {
        "default-src": [CSP.SELF],
        "script-src": [CSP.SELF, CSP.NONCE],
        "style-src": [CSP.SELF, CSP.NONCE],
        "img-src": [CSP.SELF, "data:"],
    }

ROOT_URLCONF = "example.urls"
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
if django.VERSION >= (6, 0):
    TEMPLATES[0]["OPTIONS"]["context_processors"].append("django.template.context_processors.csp")
WSGI_APPLICATION = "example.wsgi.application"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DJANGO_JOBS = {
    # Short waits so that the demo's retry happens while you watch.
    "BACKOFF": {"kind": "fixed", "base": 1.0, "ceiling": 1.0, "jitter": 0.0},
    "POLL_INTERVAL": 0.5,
}

# Django's Tasks framework runs on django-jobs: @task functions in shop/tasks.py.
TASKS = {
    "default": {
        "BACKEND": "django_jobs.backend.JobsBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {
        "django_jobs": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        # Django logs each task's start and finish at INFO; the worker's one line per
        # outcome already says it. Failed tasks still log here, at ERROR.
        "django.tasks": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}
