"""The DJANGO_JOBS settings, read through one cached function."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Database alias that holds the jobs, completion markers and dead letters.
    "DATABASE": "default",
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
    return {**DEFAULTS, **getattr(settings, "DJANGO_JOBS", {})}


def get(name: str) -> Any:
    """Return one setting."""
    return get_settings()[name]


def database() -> str:
    """Return the alias of the jobs database."""
    alias: str = get_settings()["DATABASE"]
    return alias


# Modules that cache something derived from the settings (the JSON encoder, the
# schedules) clear it with receivers of their own: conf imports none of them.
@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "DJANGO_JOBS":
        get_settings.cache_clear()
