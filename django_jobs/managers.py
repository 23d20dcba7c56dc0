"""The manager of every django-jobs model: its queries go to DJANGO_JOBS["DATABASE"]."""

from __future__ import annotations

from django.db import models

from django_jobs import conf


class JobsDatabaseManager[M: models.Model](models.Manager[M]):
    """Send queries to the jobs database (DJANGO_JOBS["DATABASE"]) unless told otherwise."""

    def get_queryset(self) -> models.QuerySet[M]:
        return super().get_queryset().using(self._db or conf.database())
