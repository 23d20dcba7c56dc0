"""Route django-jobs' tables to DJANGO_JOBS["DATABASE"] when it is not "default".

    DATABASE_ROUTERS = ["django_jobs.routers.JobsRouter"]

Reads and writes already go there through the models' managers; the router is
what makes ``migrate`` create the tables on that database and nowhere else.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

from django_jobs import conf

APP_LABEL = "django_jobs"


class JobsRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return conf.database() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return conf.database() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == APP_LABEL:
            return db == conf.database()
        return None
