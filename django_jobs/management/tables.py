"""The check every command that reads or writes the job tables makes first.

A forgotten `migrate` then ends in one line that names the fix, the same from
runjobs, jobs, replayjobs and prunejobs, instead of a "no such table" traceback.
"""

from __future__ import annotations

import logging

from django.core.management.base import CommandError
from django.db import DatabaseError

from django_jobs import conf, schema

logger = logging.getLogger("django_jobs.management")


def require_job_tables(alias: str | None = None) -> None:
    """Raise CommandError when database alias (default: the jobs database) lacks migrations."""
    alias = alias or conf.database()
    try:
        missing = schema.unapplied_migrations(alias)
    except DatabaseError as exc:
        # The database is away: the command's own queries (or the worker's retries) say so.
        logger.warning("could not check the migrations on database %r (%s)", alias, exc)
        return
    if missing:
        raise CommandError(
            f"{len(missing)} django_jobs migration(s) are not applied on database {alias!r}: "
            f"run `{schema.migrate_command(alias)}` first"
        )
