"""Prometheus metrics through an opt-in view (needs the `prometheus` extra: prometheus_client).

    # urls.py
    from django_jobs.metrics import metrics_view
    urlpatterns += [path("metrics/jobs", metrics_view)]

One scrape covers every worker on every host: the view reads the queues from the
tables and each live worker's counters from its heartbeat row (written every
MAINTENANCE_INTERVAL), so nothing needs a port on the workers. Counters carry a
``worker`` label and restart at zero with their worker, which Prometheus' rate()
and increase() handle. ``django_jobs_enqueued_total`` counts the enqueues of the
process serving the scrape (with DJANGO_JOBS["METRICS"] = True). With several job
databases (DJANGO_JOBS["DATABASES"]) one scrape covers them all, each sample labelled
with its ``database``. A job database that cannot be read (down, not migrated) fails
no scrape: ``django_jobs_database_up`` is 0 for it, its other series are absent, and
the other databases' are there as usual.

Access: a request with ``Authorization: Bearer <METRICS_TOKEN>``, or from a user who may
see the admin's jobs dashboard (dashboard.may_see: active staff with any django_jobs
permission); anything else gets 403.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from django_jobs import conf, dashboard, signals, status
from django_jobs.fleet import DURATION_BUCKETS

logger = logging.getLogger(__name__)

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import choose_encoder
except ImportError:  # the optional extra is not installed
    prometheus_client = None  # type: ignore[assignment]  # checked by _require()

_process_registry: Any = None
_enqueued: Any = None


def _require() -> None:
    if prometheus_client is None:
        raise ImproperlyConfigured(
            "django_jobs.metrics needs prometheus_client: "
            "pip install 'django-durable-jobs[prometheus]'"
        )


class JobsCollector:
    """Collect queue gauges and worker counters from the job databases at scrape time.

    Every job database (conf.databases()), or database `alias` alone. With several job
    databases each sample carries a ``database`` label (the alias), so that one queue's
    figures in two databases stay two series; with a single one, the labels are as
    they always were.
    """

    def __init__(self, alias: str | None = None) -> None:
        self.aliases = [alias] if alias else list(conf.databases())
        self.labeled = len(conf.databases()) > 1

    def collect(self) -> Iterator[Any]:
        db = ["database"] if self.labeled else []
        up = GaugeMetricFamily(
            "django_jobs_database_up",
            "1 if the scrape could read the job database, else 0.",
            labels=db,
        )
        jobs = GaugeMetricFamily(
            "django_jobs_queue_jobs",
            "Live jobs by queue and state.",
            labels=[*db, "queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "django_jobs_queue_oldest_wait_seconds",
            "How long the oldest due job has waited.",
            labels=[*db, "queue"],
        )
        paused = GaugeMetricFamily(
            "django_jobs_queue_paused", "1 if the queue is paused.", labels=[*db, "queue"]
        )
        done = GaugeMetricFamily(
            "django_jobs_queue_done_last_hour",
            "Jobs completed in the last hour.",
            labels=[*db, "queue"],
        )
        dead = GaugeMetricFamily(
            "django_jobs_queue_dead_last_hour",
            "Jobs dead-lettered in the last hour.",
            labels=[*db, "queue"],
        )
        workers = GaugeMetricFamily(
            "django_jobs_workers", "Live workers (recent heartbeat row).", labels=db
        )
        labels = [*db, "worker", "host"]
        claimed = CounterMetricFamily(
            "django_jobs_jobs_claimed", "Jobs claimed (attempts started).", labels=labels
        )
        started = CounterMetricFamily(
            "django_jobs_jobs_started", "Jobs handed to a handler.", labels=labels
        )
        finished = CounterMetricFamily(
            "django_jobs_jobs_finished", "Jobs finished, by outcome.", labels=[*labels, "outcome"]
        )
        reruns = CounterMetricFamily(
            "django_jobs_reexecutions",
            "Re-executions detected: lease taken over (lease_lost), marker found (already_done), "
            "dead worker's job rescued (rescued).",
            labels=[*labels, "kind"],
        )
        ticks = CounterMetricFamily(
            "django_jobs_schedule_ticks", "Periodic jobs enqueued.", labels=labels
        )
        duration = HistogramMetricFamily(
            "django_jobs_job_duration_seconds", "Handler run time.", labels=labels, unit=""
        )
        for alias in self.aliases:
            where = [alias] if self.labeled else []
            try:
                report = status.status(alias)
            except DatabaseError as exc:
                # One database away must not blank the others' figures (a 500 would):
                # its series are left out, and its up gauge says why they are.
                up.add_metric(where, 0.0)
                text = str(exc).strip()
                logger.warning(
                    "could not read job database %r for the metrics: %s",
                    alias,
                    text.splitlines()[0] if text else type(exc).__name__,
                )
                continue
            up.add_metric(where, 1.0)
            for q in report.queues:
                for state in ("waiting", "scheduled", "running", "blocked"):
                    jobs.add_metric([*where, q.name, state], getattr(q, state))
                oldest.add_metric([*where, q.name], q.oldest_wait or 0.0)
                paused.add_metric([*where, q.name], 1.0 if q.paused else 0.0)
                done.add_metric([*where, q.name], q.done_last_hour)
                dead.add_metric([*where, q.name], q.dead_last_hour)
            workers.add_metric(where, len(report.workers))
            for w in report.workers:
                stats, key = _WorkerStats(w.stats), [*where, w.id, w.host]
                stats.add(claimed, key, "claimed")
                stats.add(started, key, "started")
                outcomes = stats.get("outcomes", {})
                if not isinstance(outcomes, dict):
                    stats.bad.append("outcomes")
                    outcomes = {}
                outcomes = {"succeeded": 0, "retried": 0, "dead": 0, "snoozed": 0, **outcomes}
                for outcome, n in sorted(outcomes.items(), key=lambda item: str(item[0])):
                    stats.add(finished, [*key, str(outcome)], f"outcomes.{outcome}", n)
                stats.add(reruns, [*key, "lease_lost"], "lost")
                stats.add(reruns, [*key, "already_done"], "skipped")
                stats.add(reruns, [*key, "rescued"], "rescued")
                stats.add(ticks, key, "scheduled")
                counts = stats.get("duration_buckets") or [0] * (len(DURATION_BUCKETS) + 1)
                total = _counter(stats.get("duration_sum", 0.0))
                if not isinstance(counts, list) or None in map(_counter, counts) or total is None:
                    stats.bad.append("duration_buckets")
                else:
                    cumulative, buckets = 0, []
                    for bound, n in zip(
                        [*map(str, DURATION_BUCKETS), "+Inf"], counts, strict=False
                    ):
                        cumulative += n
                        buckets.append((bound, cumulative))
                    duration.add_metric(key, buckets, total)
                if stats.bad:
                    _warn_once(w.id, stats.bad)
        yield from (up, jobs, oldest, paused, done, dead, workers)
        yield from (claimed, started, finished, reruns, ticks, duration)
        if _process_registry is not None:
            yield from _process_registry.collect()


def _counter(value: Any) -> float | None:
    """Return value as a float if it can be a counter (a finite number >= 0), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0 <= number < math.inf else None


_MISSING: Any = object()


class _WorkerStats:
    """A worker's stats as its heartbeat row holds them, which anyone may have edited."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw if isinstance(raw, dict) else {}
        self.bad: list[str] = [] if isinstance(raw, dict) else ["stats"]

    def get(self, name: str, default: Any = None) -> Any:
        return self.raw.get(name, default)

    def add(self, family: Any, labels: list[str], name: str, value: Any = _MISSING) -> None:
        """Add the counter `name` (or value) to family; note it as malformed if it is not one."""
        number = _counter(self.raw.get(name, 0) if value is _MISSING else value)
        if number is None:
            self.bad.append(name)
        else:
            family.add_metric(labels, number)


_warned: set[str] = set()


def _warn_once(worker_id: str, names: list[str]) -> None:
    if worker_id in _warned:
        return
    if len(_warned) > 10_000:  # workers come and go: keep the set bounded
        _warned.clear()
    _warned.add(worker_id)
    logger.warning(
        "worker %s: malformed stats in its heartbeat row (%s); left out of the metrics",
        worker_id,
        ", ".join(names[:10]),
    )


def _allowed(request: HttpRequest) -> bool:
    token = conf.get("METRICS_TOKEN")
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), str(token).encode())
    return dashboard.may_see(getattr(request, "user", None))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the metrics in the Prometheus text format (or OpenMetrics if the scraper asks)."""
    _require()
    if not _allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector())
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)


def _count_enqueue(sender: Any, *, queue: str, duplicate: bool | None, **kwargs: Any) -> None:
    if not duplicate:
        _enqueued.labels(queue=queue).inc()


def install() -> None:
    """Count this process's enqueues (called at startup when DJANGO_JOBS["METRICS"] is True)."""
    global _process_registry, _enqueued
    _require()
    if _process_registry is None:
        _process_registry = prometheus_client.CollectorRegistry(auto_describe=False)
        _enqueued = prometheus_client.Counter(
            "django_jobs_enqueued",
            "Jobs enqueued by this process.",
            ["queue"],
            registry=_process_registry,
        )
    signals.job_enqueued.connect(_count_enqueue, dispatch_uid="django_jobs.metrics.enqueued")
