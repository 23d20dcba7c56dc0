"""System checks of the DJANGO_JOBS settings: E001..E019, W001, W003, E211."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_jobs import conf, encryption, flow, limits, registry
from django_jobs.registry import Backoff
from django_jobs.store import JobStore


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
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        errors.append(
            Error(
                f"DJANGO_JOBS['DATABASE'] is {limits.shown(alias)}, which is not in DATABASES.",
                id="django_jobs.E003",
            )
        )
        return errors
    errors += _check_databases(s["DATABASES"], s["ROUTE"], alias)
    # Every number is checked against its limit here, so that a worker never meets
    # one the database cannot add to now() or store (LEASE = 1e13, say).
    for name, high in (
        ("CONCURRENCY", limits.MAX_CONCURRENCY),
        ("ASYNC_CONCURRENCY", limits.MAX_ASYNC_CONCURRENCY),
        ("BATCH", limits.MAX_INT),
        ("MAX_ATTEMPTS", limits.MAX_INT),
    ):
        try:
            limits.integer(f"DJANGO_JOBS['{name}']", s[name], 1, high)
        except ValueError as exc:
            errors.append(Error(f"{exc}.", id="django_jobs.E004"))
    for name, zero in (("LEASE", False), ("GRACE", True), ("POLL_INTERVAL", False)):
        try:
            limits.seconds(f"DJANGO_JOBS['{name}']", s[name], zero=zero)
        except ValueError as exc:
            errors.append(Error(f"{exc}.", id="django_jobs.E005"))
    timeout, heartbeat, lease = s["TIMEOUT"], s["HEARTBEAT"], s["LEASE"]
    if timeout is not None:
        try:
            limits.seconds("DJANGO_JOBS['TIMEOUT']", timeout)
        except ValueError as exc:
            errors.append(Error(f"{exc}.", hint="None means no limit.", id="django_jobs.E006"))
    if heartbeat is not None:
        try:
            limits.seconds("DJANGO_JOBS['HEARTBEAT']", heartbeat, zero=True)
        except ValueError as exc:
            errors.append(
                Error(
                    f"{exc}.",
                    hint="None means a third of LEASE; 0 turns heartbeats off.",
                    id="django_jobs.E007",
                )
            )
            heartbeat = None
    if isinstance(lease, int | float) and heartbeat and heartbeat >= lease:
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
        not isinstance(queues, list | tuple | set | frozenset | dict)
        or not all(_queue_name(q) for q in queues)
    ):
        errors.append(
            Error(
                "DJANGO_JOBS['QUEUES'] must be None or a list of queue names.",
                hint=f"Letters, digits and _ . : -, at most {limits.MAX_QUEUE_LENGTH} characters.",
                id="django_jobs.E010",
            )
        )
    if not _queue_name(s["DEFAULT_QUEUE"]):
        errors.append(
            Error(
                f"DJANGO_JOBS['DEFAULT_QUEUE'] must be a queue name, not "
                f"{limits.shown(s['DEFAULT_QUEUE'])}.",
                hint=f"Letters, digits and _ . : -, at most {limits.MAX_QUEUE_LENGTH} characters.",
                id="django_jobs.E010",
            )
        )
    errors.extend(_check_flow(queues, alias))
    errors.extend(_check_encryption(s["ENCRYPTION_KEYS"]))
    limit = s["MAX_PAYLOAD_BYTES"]
    if limit is not None:
        try:
            limits.integer("DJANGO_JOBS['MAX_PAYLOAD_BYTES']", limit, 2, limits.MAX_PAYLOAD_BYTES)
        except ValueError as exc:
            errors.append(Error(f"{exc}.", hint="None means no limit.", id="django_jobs.E011"))
    channel = s["CHANNEL"]
    if not (isinstance(channel, str) and len(channel) < 64 and limits.QUEUE_RE.fullmatch(channel)):
        errors.append(
            Error(
                f"DJANGO_JOBS['CHANNEL'] must be a name of 1 to 63 characters: "
                f"{limits.QUEUE_FORM}; not {limits.shown(channel)}.",
                hint="It names the LISTEN/NOTIFY channel; PostgreSQL refuses longer names.",
                id="django_jobs.E014",
            )
        )
    if type(s["TRACING"]) is not bool:
        errors.append(
            Error(
                f"DJANGO_JOBS['TRACING'] must be True or False, not {limits.shown(s['TRACING'])}.",
                hint="True traces enqueues and attempts when a tracer provider is set "
                "(docs/observability.md); False never does.",
                id="django_jobs.E016",
            )
        )
    try:
        limits.priority_aging(s["PRIORITY_AGING"])
    except ValueError as exc:
        errors.append(
            Error(
                f"{exc}.",
                hint="None (off), or the wait that raises a job one priority step, e.g. "
                "timedelta(minutes=10) or 600.",
                id="django_jobs.E017",
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
    if not JobStore(alias).claims_safely():
        errors.append(
            Error(
                f"The jobs database {alias!r} ({connection.display_name}) does not support "
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


def _check_databases(listed: Any, route: Any, alias: str) -> list[Any]:
    """Check DATABASES (aliases of DATABASES, holding DATABASE) and ROUTE (E018, E019)."""
    errors = []
    if listed is not None:
        valid = isinstance(listed, list | tuple) and bool(listed)
        unknown = [
            a
            for a in (listed if valid else ())
            if not isinstance(a, str) or a not in settings.DATABASES
        ]
        problem = (
            "it must be a non-empty list of aliases"
            if not valid
            else f"{', '.join(map(limits.shown, unknown))} not in DATABASES"
            if unknown
            else f"it leaves out DJANGO_JOBS['DATABASE'] ({alias!r})"
            if alias not in listed
            else ""
        )
        if problem:
            errors.append(
                Error(
                    f"DJANGO_JOBS['DATABASES'] is {limits.shown(listed)}: {problem}.",
                    hint="List every alias of DATABASES that holds the job tables (each "
                    f"migrated with `migrate --database ALIAS`; DATABASES has "
                    f"{', '.join(map(repr, settings.DATABASES))}), DJANGO_JOBS['DATABASE'] "
                    "among them, or leave DJANGO_JOBS['DATABASES'] out for one database.",
                    id="django_jobs.E018",
                )
            )
    if route is not None:
        try:
            found = conf.route()
        except ImproperlyConfigured as exc:
            found, problem = None, f"cannot be imported ({exc.__cause__})"
        else:
            problem = "is not callable"
        if not callable(found):
            errors.append(
                Error(
                    f"DJANGO_JOBS['ROUTE'] {problem}: {limits.shown(route)}.",
                    hint="A function of (name, queue, payload) returning an alias of "
                    "DJANGO_JOBS['DATABASES'] or None, or its dotted path.",
                    id="django_jobs.E019",
                )
            )
    return errors


def _check_encryption(keys: Any) -> list[Any]:
    """Check ENCRYPTION_KEYS, and that the handlers that encrypt can (E401-E403)."""
    sealed = sorted(h.name for h in registry.all_handlers().values() if h.encrypt is not None)
    if not sealed and keys in ([], (), None):
        return []
    found = []
    if not encryption.installed():
        found.append(
            Error(
                "Encrypted payloads need the cryptography package, which is not installed.",
                hint="pip install 'django-jobs[encryption]' (cryptography>=42).",
                id="django_jobs.E401",
            )
        )
    wrong = [] if keys in ([], (), None) else encryption.problems(keys)
    if sealed and keys in ([], (), None):
        found.append(
            Error(
                f"Handlers encrypt their payloads ({', '.join(sealed[:5])}) but "
                "DJANGO_JOBS['ENCRYPTION_KEYS'] is empty.",
                hint="Set it to a list of keys made by cryptography.fernet.Fernet.generate_key(),"
                " read from the environment or a secret store; the first encrypts.",
                id="django_jobs.E402",
            )
        )
    else:
        found += [
            Error(
                f"{problem}.",
                hint="Each key: Fernet.generate_key().decode(), 44 characters of url-safe base64.",
                id="django_jobs.E403",
            )
            for problem in wrong
        ]
    return found


def _check_flow(queues: Any, alias: str) -> list[Any]:
    """Check QUEUES' limits, and that the jobs database enforces the limits declared."""
    try:
        limited = sorted(flow.queue_limits(queues))
    except ValueError as exc:
        return [
            Error(
                f"DJANGO_JOBS['QUEUES'] has invalid limits: {exc}.",
                hint='For example {"emails": {"global_concurrency": 5, "rate_limit": "10/s"}}.',
                id="django_jobs.E301",
            )
        ]
    limited += [g.key for g in flow.handler_limits(registry.all_handlers().values())]
    if limited and not JobStore(alias).enforces_limits:
        vendor = connections[alias].display_name
        return [
            Warning(
                f"Flow limits are declared ({', '.join(limited[:5])}) but the jobs database "
                f"is {vendor}, which does not enforce them: workers and drain() run these "
                "jobs without their limits here.",
                hint="global_concurrency and rate_limit are enforced on PostgreSQL only; "
                "fine for development and tests, but deploy on PostgreSQL (or silence "
                "this with SILENCED_SYSTEM_CHECKS).",
                id="django_jobs.W302",
            )
        ]
    return []


def _queue_name(value: Any) -> bool:
    try:
        limits.queue_name(value)
    except ValueError:
        return False
    return True


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


@register(Tags.admin)
def check_admin_apps(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    # Without it the dead-letter and marker lists fail on their first request
    # (TemplateDoesNotExist rangefilter/date_filter.html), long after check passed.
    if not apps.is_installed("django.contrib.admin") or apps.is_installed("rangefilter"):
        return []
    return [
        Error(
            "'rangefilter' is not in INSTALLED_APPS: the jobs admin's date-range filters "
            "need its templates.",
            hint="Add 'rangefilter' (django-admin-rangefilter, installed with django-jobs) "
            "to INSTALLED_APPS.",
            id="django_jobs.E015",
        )
    ]
