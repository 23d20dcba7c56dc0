"""System checks (``manage.py check``), one module per concern; importing this registers them.

``configuration`` (the DJANGO_JOBS settings), ``database`` (migrations, SQLite,
autovacuum, a pooler), ``schedules`` and ``operations`` (retention, upkeep,
metrics). docs/configuration.md lists every check id.
"""

from django_jobs.checks.configuration import check_admin_apps, check_claim, check_settings
from django_jobs.checks.database import (
    check_atomic_requests,
    check_autovacuum,
    check_migrations,
    check_pooler,
    check_sqlite,
)
from django_jobs.checks.operations import check_operations
from django_jobs.checks.schedules import check_schedules

__all__ = [
    "check_admin_apps",
    "check_atomic_requests",
    "check_autovacuum",
    "check_claim",
    "check_migrations",
    "check_operations",
    "check_pooler",
    "check_schedules",
    "check_settings",
    "check_sqlite",
]
