"""System checks of the schedules (SCHEDULES and @periodic): E201, E202, E208, E213."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register

from django_jobs import conf, registry, schedules
from django_jobs.exceptions import InvalidJob


@register(Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Check every declared schedule, and that a registered handler runs it."""
    errors: list[Any] = []
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
                    hint="".join(
                        f"Did you mean {close!r}? " for close in registry.close_names(spec.job)[:1]
                    )
                    + "Use the handler's name "
                    "(its dotted path unless @job(name=...) says otherwise).",
                    id="django_jobs.E202",
                )
            )
        if spec.database not in ("", "*", *conf.databases()):
            errors.append(
                Error(
                    f"Schedule {spec.name!r} fires in database {spec.database!r}, which is "
                    "not a job database.",
                    hint="Name an alias of DJANGO_JOBS['DATABASES'] (or '*' for every one).",
                    id="django_jobs.E213",
                )
            )
    if specs and not settings.USE_TZ:
        errors.append(Error("Schedules need USE_TZ = True.", id="django_jobs.E208"))
    return errors
