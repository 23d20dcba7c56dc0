"""The job tables on a database: which migrations it lacks, and the command that adds them.

The system checks, ``runjobs`` and enqueue's error on missing tables all name the
fix the same way.
"""

from __future__ import annotations

from django.db import connections


def unapplied_migrations(alias: str) -> list[str]:
    """Return the names of django_jobs' migrations that are not applied on database alias."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    applied = loader.applied_migrations
    return sorted(
        name
        for app, name in loader.graph.nodes
        if app == "django_jobs" and (app, name) not in applied
    )


def migrate_command(alias: str) -> str:
    """Return the command that creates the job tables on database alias."""
    return "python manage.py migrate" + (f" --database {alias}" if alias != "default" else "")
