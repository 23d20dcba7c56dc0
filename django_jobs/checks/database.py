"""System checks of the jobs database: migrations, SQLite's options, autovacuum, a pooler."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections

from django_jobs import conf, limits, sqlite
from django_jobs.schema import migrate_command, unapplied_migrations


@register(Tags.database)
def check_migrations(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when a job database lacks django_jobs' migrations (`check --database ALIAS`)."""
    if not databases or _inside_migrate():
        return []  # `migrate` runs the database checks just before it applies them
    found = []
    for alias in _job_databases():
        if alias not in databases:
            continue
        try:
            missing = unapplied_migrations(alias)
        except DatabaseError:
            continue  # an unreachable database: Django's own database checks say so
        if missing:
            found.append(
                Warning(
                    f"{len(missing)} django_jobs migration(s) are not applied on the jobs "
                    f"database {alias!r}: {', '.join(missing)}.",
                    hint=f"Run `{migrate_command(alias)}`. Until then enqueue fails and "
                    "runjobs refuses to start.",
                    id="django_jobs.W020",
                )
            )
    return found


def _job_databases() -> list[str]:
    """The job databases that DATABASES defines (E003 and E018 report the others)."""
    alias = conf.get("DATABASE")
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return []  # E003
    return [a for a in conf.databases() if isinstance(a, str) and a in settings.DATABASES]


def _inside_migrate() -> bool:
    from django.core.management.commands.migrate import Command as Migrate

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


@register(Tags.compatibility)
def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when a SQLite job database's OPTIONS undo what concurrent workers need."""
    found = []
    for alias in _job_databases():
        if connections[alias].vendor != "sqlite":
            continue
        notes = sqlite.missing_options(settings.DATABASES[alias])
        if notes:
            found.append(
                Warning(
                    f"The SQLite jobs database {alias!r} is set up for one process at a "
                    f"time: {'; '.join(notes)}. Workers and web processes will fail with "
                    '"database is locked".',
                    hint='Remove those OPTIONS, or set "transaction_mode": "IMMEDIATE" and '
                    '"init_command": "PRAGMA journal_mode=WAL;" (django-jobs sets both when '
                    "OPTIONS leave them out).",
                    id="django_jobs.W021",
                )
            )
    return found


@register(Tags.compatibility)
def check_atomic_requests(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when views run in a transaction on an alias that does not hold the jobs."""
    alias = conf.get("DATABASE")
    jobs = _job_databases()
    if not jobs:
        return []  # E003
    if any(settings.DATABASES[a].get("ATOMIC_REQUESTS") for a in jobs):
        return []  # the jobs commit with the request's transaction
    return [
        Warning(
            f"ATOMIC_REQUESTS is on for database {other!r}, which does not hold the jobs "
            f"(DJANGO_JOBS['DATABASE'] is {alias!r}): in a view, enqueue_on_commit raises "
            f"InvalidJob, since a job written at once on {alias!r} would outlive a "
            "rollback of the request.",
            hint=f"Pass commit_of={other!r} to enqueue_on_commit in views, or keep the "
            f"jobs on {other!r} (DJANGO_JOBS['DATABASE'], or one of DATABASES).",
            id="django_jobs.W022",
        )
        for other, options in settings.DATABASES.items()
        if other not in jobs and options.get("ATOMIC_REQUESTS")
    ]


@register(Tags.database)
def check_autovacuum(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when a job database does not autovacuum: the jobs table would grow without end."""
    return [
        found
        for alias in _job_databases()
        if databases and alias in databases and connections[alias].vendor == "postgresql"
        for found in _autovacuum(alias)
    ]


def _autovacuum(alias: str) -> list[Any]:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            setting = cursor.fetchone()[0]
    except DatabaseError:
        return []
    if setting == "on":
        return []
    return [
        Warning(
            f"autovacuum is off on the jobs database {alias!r}.",
            hint="Finished jobs are deleted from django_jobs_job; without VACUUM their space is "
            "never reused and the table and its claim index grow with every job. Turn autovacuum "
            "on, or VACUUM django_jobs_job and django_jobs_marker every few seconds.",
            id="django_jobs.W201",
        )
    ]


@register(Tags.compatibility)
def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when LISTEN or prepared statements are on behind a transaction pooler."""
    pooler = conf.get("POOLER")
    if pooler not in (None, "transaction"):
        return [
            Error(
                f"DJANGO_JOBS['POOLER'] must be None or 'transaction', not {limits.shown(pooler)}.",
                hint="Set 'transaction' when the jobs database is reached through PgBouncer "
                "(or another pooler) in transaction pooling; leave it None otherwise.",
                id="django_jobs.E210",
            )
        ]
    if not pooler:
        return []
    fixes = [
        f"DJANGO_JOBS['{key}'] = False"
        for key in ("LISTEN", "PREPARED_STATEMENTS")
        if conf.get(key)
    ]
    # Django prepares its own queries too once this psycopg option asks for it.
    for alias in _job_databases():
        if connections[alias].settings_dict["OPTIONS"].get("prepare_threshold") is not None:
            fixes.append(f"DATABASES[{alias!r}]['OPTIONS']['prepare_threshold'] = None")
    if not fixes:
        return []
    return [
        Warning(
            "DJANGO_JOBS['POOLER'] is 'transaction', but LISTEN or prepared statements are on.",
            hint="A transaction pooler hands each transaction to any server session: LISTEN "
            "never hears a notification and prepared statements go missing (PgBouncer < 1.21). "
            f"Set {'; '.join(fixes)} (runjobs --no-listen also turns LISTEN off).",
            id="django_jobs.W202",
        )
    ]
