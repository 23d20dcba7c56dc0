"""System checks of the operations settings (retention, upkeep, unknown names, metrics)."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.core.checks import Error, Tags, Warning, register

from django_jobs import conf, limits, registry, retention
from django_jobs.fleet import unknown_name_grace


@register(Tags.compatibility)
def check_operations(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Check retention, the upkeep's intervals, UNKNOWN_NAME_GRACE and the metrics settings."""
    errors: list[Any] = []
    s = conf.get_settings()
    for name in ("KEEP_MARKERS", "KEEP_DEAD_LETTERS"):
        try:
            retention.as_timedelta(s[name], what=name)
        except ValueError as exc:
            errors.append(Error(f"DJANGO_JOBS['{name}'] is invalid: {exc}", id="django_jobs.E203"))
    errors.extend(_unique_beyond_markers(s["KEEP_MARKERS"]))
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


def _unique_beyond_markers(keep: Any) -> list[Any]:
    """W203: handlers unique for longer than markers are kept (their period outlives the
    marker of a job that finished early in it: a second job of the period would run)."""
    try:
        kept = retention.as_timedelta(keep, what="KEEP_MARKERS")
    except ValueError:
        return []  # E203
    if kept is None:
        return []
    longer = sorted(
        h.name
        for h in registry.all_handlers().values()
        if h.unique_for is not None and h.unique_for > kept
    )
    if not longer:
        return []
    return [
        Warning(
            f"unique_for of {', '.join(longer)} is longer than DJANGO_JOBS['KEEP_MARKERS'] "
            f"({kept}): a job that finishes early in its period loses its completion marker to "
            "pruning before the period ends, and a second job of that period is then enqueued.",
            hint="Keep markers at least as long as the longest unique_for, or shorten it.",
            id="django_jobs.W203",
        )
    ]
