"""The DJANGO_JOBS settings, read through one cached function."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Database alias that holds the jobs, completion markers and dead letters (the
    # default of several, below; when only DATABASES is set, its first alias).
    "DATABASE": "default",
    # Every alias that holds job tables, when jobs live in more than one database
    # (docs/scaling.md#several-databases); None: DATABASE alone.
    "DATABASES": None,
    # Where enqueue writes a job that names no database and whose caller has no
    # transaction open on one: a callable (or its dotted path) of (name, queue, payload)
    # returning an alias of DATABASES, or None for DATABASE.
    "ROUTE": None,
    # Queue of handlers that name none.
    "DEFAULT_QUEUE": "default",
    # If a list, the only queue names enqueue accepts.
    "QUEUES": None,
    # Retry policy of handlers that declare none.
    "MAX_ATTEMPTS": 5,
    "BACKOFF": {"kind": "exponential", "base": 2.0, "ceiling": 600.0, "jitter": 0.25},
    # Seconds a handler may run before its attempt fails; None: no limit.
    "TIMEOUT": None,
    # Worker defaults (runjobs options override them).
    "CONCURRENCY": 4,
    # Async handlers a worker runs at once as tasks on its event loop.
    "ASYNC_CONCURRENCY": 100,
    "BATCH": 100,
    "LEASE": 30.0,
    # Seconds between lease extensions of running jobs; None: lease / 3; 0: never.
    "HEARTBEAT": None,
    "GRACE": 30.0,
    "POLL_INTERVAL": 1.0,
    # LISTEN/NOTIFY wake-ups on PostgreSQL; set False behind PgBouncer in transaction pooling.
    "LISTEN": True,
    "CHANNEL": "django_jobs",
    # Prepare the hot statements once per connection on PostgreSQL; set False behind
    # a pooler that cannot keep prepared statements (PgBouncer < 1.21, transaction pooling).
    "PREPARED_STATEMENTS": True,
    # OpenTelemetry traces of enqueues and attempts, when the application has set a
    # tracer provider (docs/observability.md); False: none even then.
    "TRACING": True,
    # "transaction" when the jobs database is reached through a transaction pooler
    # (PgBouncer's pool_mode = transaction); a system check then asks for the two above off.
    "POOLER": None,
    # "orm": claim with select_for_update(skip_locked=True) on PostgreSQL too, instead of
    # the one-statement fast path ("auto"); other databases with SKIP LOCKED always do.
    "CLAIM": "auto",
    # Priority aging: a due job is claimed as if its priority were one higher per this
    # many seconds (or timedelta) it has waited; None: off (docs/worker.md#priority-aging).
    "PRIORITY_AGING": None,
    # Payloads larger than this (in UTF-8 bytes of JSON) are refused at enqueue.
    "MAX_PAYLOAD_BYTES": 64 * 1024,
    # Dotted path of a json.JSONEncoder subclass for payloads (e.g. DjangoJSONEncoder).
    "JSON_ENCODER": None,
    # Secret names: payload and result keys holding one of them as words (access_token,
    # x-api-key, clientSecret: see payloads.is_secret_key) show as "********" in the admin.
    "MASK_KEYS": [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "api_key",
        "apikey",
        "authorization",
        "credential",
        "private_key",
        "cookie",
        "sessionid",
    ],
    # Fernet keys of @job(encrypt=...) handlers: the first encrypts, every one decrypts.
    "ENCRYPTION_KEYS": [],
    # ---- operations (schedules, retention, control, metrics) ----
    # Periodic jobs: {"name": {"cron": "0 3 * * *", "job": "app.jobs.nightly", ...}};
    # see schedules.py.
    "SCHEDULES": {},
    # How long completion markers and dead letters are kept (seconds or timedelta); None: forever.
    "KEEP_MARKERS": 7 * 24 * 3600,
    "KEEP_DEAD_LETTERS": 30 * 24 * 3600,
    # Rows deleted per pruning statement: small, so that pruning never holds long locks.
    "PRUNE_BATCH": 500,
    # Seconds between a worker's maintenance steps (heartbeat row, schedules, pruning).
    "MAINTENANCE_INTERVAL": 5.0,
    # A worker whose heartbeat row is older than this many seconds is not live.
    "WORKER_EXPIRY": 60.0,
    # How long jobs whose name no live worker knows wait (for a worker that has the
    # handler, during a rolling deploy) before the upkeep dead-letters them as
    # unknown_name (seconds, timedelta or "2h"); None: they wait forever.
    "UNKNOWN_NAME_GRACE": 3600,
    # Count enqueues of this process for the metrics view (needs prometheus_client).
    "METRICS": False,
    # Bearer token that the metrics view accepts; None: staff users only.
    "METRICS_TOKEN": None,
}


@cache
def get_settings() -> dict[str, Any]:
    """Return DEFAULTS updated with the project's DJANGO_JOBS."""
    own = getattr(settings, "DJANGO_JOBS", {})
    merged = {**DEFAULTS, **own}
    listed = own.get("DATABASES")
    if "DATABASE" not in own and isinstance(listed, list | tuple) and listed:
        merged["DATABASE"] = listed[0]
    return merged


def get(name: str) -> Any:
    """Return one setting."""
    return get_settings()[name]


def database() -> str:
    """Return the alias of the jobs database (the default one, when there are several)."""
    alias: str = get_settings()["DATABASE"]
    return alias


@cache
def databases() -> tuple[str, ...]:
    """Return every alias that holds job tables: DATABASE first, then DATABASES' others."""
    s = get_settings()
    listed = s["DATABASES"] if isinstance(s["DATABASES"], list | tuple) else ()
    return tuple(dict.fromkeys([s["DATABASE"], *listed]))


@cache
def route() -> Callable[[str, str, Any], str | None] | None:
    """Return DJANGO_JOBS["ROUTE"] as a callable (imported when a dotted path), or None."""
    value = get_settings()["ROUTE"]
    if isinstance(value, str):
        from django.core.exceptions import ImproperlyConfigured
        from django.utils.module_loading import import_string

        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"DJANGO_JOBS['ROUTE'] cannot be imported: {exc} (django_jobs.E019)"
            ) from exc
    return value  # type: ignore[no-any-return]


# Modules that cache something derived from the settings (the JSON encoder, the
# schedules) clear it with receivers of their own: conf imports none of them.
@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DJANGO_JOBS", "DATABASES"):
        get_settings.cache_clear()
        databases.cache_clear()
        route.cache_clear()
