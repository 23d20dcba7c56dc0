"""The test project on a SQLite file with Django's defaults: no OPTIONS, as a new project has.

TEST_DB_NAME names the file; JOBS_SQLITE_OPTIONS (JSON) sets OPTIONS for the checks' tests.
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
