"""System checks of the operations settings (schedules, retention, maintenance, metrics): E201..."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from django_jobs import conf, limits, registry, retention, schedules
from django_jobs.exceptions import InvalidJob
from django_jobs.fleet import unknown_name_grace


@register(Tags.compatibility)
def check_operations(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    errors: list[Any] = []
    s = conf.get_settings()
    try:
        specs = schedules.declared()
    except InvalidJob as exc:
        errors.append(
            Error(
                f"Invalid schedule: {exc}",
                hint="See DJANGO_JOBS['SCHEDULES'] and @periodic.",
                id="django_jobs.E201",
            )
        )
        specs = {}
    for spec in specs.values():
        if registry.lookup(spec.job) is None:
            errors.append(
                Error(
                    f"Schedule {spec.name!r} runs {spec.job!r}, "
                    "which no @job handler is registered as.",
                    hint="Use the handler's name "
                    "(its dotted path unless @job(name=...) says otherwise).",
                    id="django_jobs.E202",
                )
            )
    if specs and not settings.USE_TZ:
        errors.append(Error("Schedules need USE_TZ = True.", id="django_jobs.E208"))
    for name in ("KEEP_MARKERS", "KEEP_DEAD_LETTERS"):
        try:
            retention.as_timedelta(s[name], what=name)
        except ValueError as exc:
            errors.append(Error(f"DJANGO_JOBS['{name}'] is invalid: {exc}", id="django_jobs.E203"))
    try:
        unknown_name_grace()
    except ValueError as exc:
        errors.append(
            Error(
                f"DJANGO_JOBS['UNKNOWN_NAME_GRACE'] is invalid: {exc}",
                hint="Seconds, a timedelta or text like '1h'; None: jobs of unknown names "
                "wait forever.",
                id="django_jobs.E212",
            )
        )
    try:
        limits.integer("DJANGO_JOBS['PRUNE_BATCH']", s["PRUNE_BATCH"], 1, limits.MAX_INT)
    except ValueError as exc:
        errors.append(Error(f"{exc}.", id="django_jobs.E204"))
    interval, expiry = s["MAINTENANCE_INTERVAL"], s["WORKER_EXPIRY"]
    try:
        limits.seconds("DJANGO_JOBS['MAINTENANCE_INTERVAL']", interval)
        limits.seconds("DJANGO_JOBS['WORKER_EXPIRY']", expiry)
    except ValueError as exc:
        errors.append(Error(f"{exc}.", id="django_jobs.E205"))
    else:
        if expiry <= 2 * interval:
            errors.append(
                Error(
                    "DJANGO_JOBS['WORKER_EXPIRY'] must be more than twice MAINTENANCE_INTERVAL.",
                    hint="Otherwise a live worker shows as gone between two heartbeat rows.",
                    id="django_jobs.E206",
                )
            )
    if s["METRICS"] and importlib.util.find_spec("prometheus_client") is None:
        errors.append(
            Error(
                "DJANGO_JOBS['METRICS'] is on but prometheus_client is not installed.",
                hint="pip install 'django-durable-jobs[prometheus]'",
                id="django_jobs.E207",
            )
        )
    token = s["METRICS_TOKEN"]
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        errors.append(
            Error(
                "DJANGO_JOBS['METRICS_TOKEN'] must be None or a string of 16+ characters.",
                id="django_jobs.E209",
            )
        )
    return errors


@register(Tags.database)
def check_autovacuum(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when the jobs database does not autovacuum: the jobs table would grow without end."""
    from django.db import DatabaseError, connections

    alias = conf.database()
    if not databases or alias not in databases or connections[alias].vendor != "postgresql":
        return []
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
    from django.db import connections

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
    alias = conf.database()
    fixes = [
        f"DJANGO_JOBS['{key}'] = False"
        for key in ("LISTEN", "PREPARED_STATEMENTS")
        if conf.get(key)
    ]
    # Django prepares its own queries too once this psycopg option asks for it.
    options = connections[alias].settings_dict["OPTIONS"] if alias in settings.DATABASES else {}
    if options.get("prepare_threshold") is not None:
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


@register(Tags.compatibility)
def check_claim(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Check DJANGO_JOBS["CLAIM"]."""
    claim = conf.get("CLAIM")
    if claim in ("auto", "orm"):
        return []
    return [
        Error(
            f"DJANGO_JOBS['CLAIM'] must be 'auto' or 'orm', not {limits.shown(claim)}.",
            hint="'auto': PostgreSQL's one-statement claim, select_for_update(skip_locked=True) "
            "elsewhere; 'orm': select_for_update(skip_locked=True) on PostgreSQL too.",
            id="django_jobs.E211",
        )
    ]
