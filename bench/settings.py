"""Settings of the benchmark project.

Django's defaults (CONN_MAX_AGE = 0, DEBUG off) on PostgreSQL.
"""

import os

SECRET_KEY = "django-jobs-bench"  # noqa: S105
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "NAME": os.environ.get("BENCH_DB", "django_jobs_bench"),
    }
}
if os.environ.get("BENCH_ENGINE") == "mariadb":
    # bench/run.py --engine mariadb: the local MariaDB, as the test suite's stage uses it.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "NAME": os.environ.get("BENCH_DB", "django_jobs_bench"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
else:
    # D2X, D1X: a second job database on a second PostgreSQL server (dev.py's cluster
    # "jobs2"), its name BENCH_DB's plus "_jobs2". Only those figures list it in
    # DJANGO_JOBS["DATABASES"] (BENCH_DATABASES in the workers they start).
    DATABASES["jobs2"] = {
        **DATABASES["default"],
        "HOST": os.environ.get("JOBS2_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("JOBS2_PGPORT", "5433"),
        "NAME": DATABASES["default"]["NAME"] + "_jobs2",
    }
# bench/run.py --claim orm: the ORM claim on PostgreSQL too.
DJANGO_JOBS = {"CLAIM": os.environ.get("BENCH_CLAIM", "auto")}
if os.environ.get("BENCH_DATABASES"):
    DJANGO_JOBS["DATABASES"] = os.environ["BENCH_DATABASES"].split(",")
# bench/run.py --tracing: the OpenTelemetry SDK on, its spans batched and dropped (the
# cost of making and ending them, not of any exporter's network).
if os.environ.get("BENCH_TRACING") == "1":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Dropped(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(_provider)
INSTALLED_APPS = ["django.contrib.contenttypes", "django_jobs", "bench.benchapp"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_jobs": {"handlers": ["stderr"], "level": "WARNING"}},
}
