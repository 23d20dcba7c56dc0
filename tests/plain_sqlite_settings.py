"""The test project on a SQLite file with Django's defaults: no OPTIONS, as a new project has.

TEST_DB_NAME names the file; JOBS_SQLITE_OPTIONS (JSON) sets OPTIONS for the checks' tests;
JOBS_NO_HANDLERS=1 leaves out the app that declares the test handlers.
"""

import json
import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TEST_DB_NAME"],
        "OPTIONS": json.loads(os.environ.get("JOBS_SQLITE_OPTIONS", "{}")),
    }
}

if os.environ.get("JOBS_NO_HANDLERS") == "1":
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tests.testapp"]  # noqa: F405
    ROOT_URLCONF = __name__
    urlpatterns: list = []
