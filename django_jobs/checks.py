"""System checks for the DJANGO_JOBS settings and the jobs database."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from django_jobs import conf
from django_jobs.registry import QUEUE_RE, Backoff


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    errors: list[Any] = []
    user = getattr(settings, "DJANGO_JOBS", {})
    if not isinstance(user, dict):
        return [Error("DJANGO_JOBS must be a dict.", id="django_jobs.E001")]
    unknown = sorted(set(user) - set(conf.DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"Unknown DJANGO_JOBS keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(conf.DEFAULTS))}.",
                id="django_jobs.E002",
            )
        )
    s = conf.get_settings()
    alias = s["DATABASE"]
    if alias not in settings.DATABASES:
        errors.append(
            Error(
                f"DJANGO_JOBS['DATABASE'] is {alias!r}, which is not in DATABASES.",
                id="django_jobs.E003",
            )
        )
        return errors
    for name in ("CONCURRENCY", "BATCH", "MAX_ATTEMPTS"):
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(f"DJANGO_JOBS['{name}'] must be a positive integer.", id="django_jobs.E004")
            )
    for name in ("LEASE", "GRACE", "POLL_INTERVAL"):
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(
                Error(
                    f"DJANGO_JOBS['{name}'] must be a positive number of seconds.",
                    id="django_jobs.E005",
                )
            )
    timeout, heartbeat, lease = s["TIMEOUT"], s["HEARTBEAT"], s["LEASE"]
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        errors.append(
            Error(
                "DJANGO_JOBS['TIMEOUT'] must be None or a positive number.", id="django_jobs.E006"
            )
        )
    if heartbeat is not None and (
        isinstance(heartbeat, bool) or not isinstance(heartbeat, int | float) or heartbeat < 0
    ):
        errors.append(
            Error(
                "DJANGO_JOBS['HEARTBEAT'] must be None, 0 or a positive number.",
                id="django_jobs.E007",
            )
        )
    elif isinstance(lease, int | float) and heartbeat and heartbeat >= lease:
        errors.append(
            Error(
                "DJANGO_JOBS['HEARTBEAT'] must be shorter than LEASE, "
                "or leases expire between beats.",
                hint="Leave HEARTBEAT as None (a third of LEASE).",
                id="django_jobs.E008",
            )
        )
    if (
        heartbeat == 0
        and isinstance(timeout, int | float)
        and isinstance(lease, int | float)
        and timeout >= lease
    ):
        errors.append(
            Warning(
                "HEARTBEAT is 0 and TIMEOUT is not shorter than LEASE: a job may run twice.",
                hint="With heartbeats off, make LEASE longer than any handler runs.",
                id="django_jobs.W001",
            )
        )
    try:
        Backoff.coerce(s["BACKOFF"])
    except (TypeError, ValueError) as exc:
        errors.append(Error(f"DJANGO_JOBS['BACKOFF'] is invalid: {exc}", id="django_jobs.E009"))
    queues = s["QUEUES"]
    if queues is not None and (
        not isinstance(queues, list | tuple | set | frozenset)
        or not all(isinstance(q, str) and QUEUE_RE.fullmatch(q) for q in queues)
    ):
        errors.append(
            Error(
                "DJANGO_JOBS['QUEUES'] must be None or a list of queue names.",
                id="django_jobs.E010",
            )
        )
    limit = s["MAX_PAYLOAD_BYTES"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
        errors.append(
            Error(
                "DJANGO_JOBS['MAX_PAYLOAD_BYTES'] must be None or an integer >= 2.",
                id="django_jobs.E011",
            )
        )

    mask_keys = s["MASK_KEYS"]
    if mask_keys is not None and (
        isinstance(mask_keys, str)
        or not isinstance(mask_keys, list | tuple | set | frozenset)
        or not all(isinstance(k, str) and k for k in mask_keys)
    ):
        errors.append(
            Error(
                "DJANGO_JOBS['MASK_KEYS'] must be a list of payload key names.",
                hint='For example ["password", "token"]; matched case-insensitively at any depth.',
                id="django_jobs.E013",
            )
        )

    connection = connections[alias]
    if (
        connection.vendor not in ("postgresql", "sqlite")
        and not connection.features.has_select_for_update_skip_locked
    ):
        errors.append(
            Error(
                f"The jobs database {alias!r} ({connection.vendor}) does not support "
                "SELECT ... FOR UPDATE SKIP LOCKED.",
                hint="Use PostgreSQL (or SQLite for a single machine).",
                id="django_jobs.E012",
            )
        )
    if alias != "default" and "django_jobs.routers.JobsRouter" not in getattr(
        settings, "DATABASE_ROUTERS", []
    ):
        errors.append(
            Warning(
                f"DJANGO_JOBS['DATABASE'] is {alias!r} but JobsRouter is not in DATABASE_ROUTERS.",
                hint="Add 'django_jobs.routers.JobsRouter' "
                "so that migrate creates the tables there.",
                id="django_jobs.W003",
            )
        )
    return errors
