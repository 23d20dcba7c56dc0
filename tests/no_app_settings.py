"""A project that configures JobsBackend but forgot 'django_jobs' in INSTALLED_APPS."""

import os

SECRET_KEY = "django-jobs-tests"  # noqa: S105
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("TEST_DB_NAME", "no-app.sqlite3"),
    }
}
TASKS = {"default": {"BACKEND": "django_jobs.backend.JobsBackend"}}
# As in most projects, the URLconf imports views, which import the tasks they enqueue.
ROOT_URLCONF = "tests.no_app_urls"
