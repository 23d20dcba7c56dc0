#!/usr/bin/env python
"""Push many jobs through and print the sizes of the jobs table, its indexes and the markers.

    .venv/bin/python bench/table_sizes.py --jobs 1000000 [--round 10000]

Runs on a scratch PostgreSQL database (created and dropped here; PG* variables as
in tests/settings.py). Dead rows are reclaimed by VACUUM, which autovacuum runs in
production; when the server has autovacuum off (as a development server may),
pass --vacuum-every S to run a plain VACUUM of the two tables every S seconds, as
autovacuum with autovacuum_naptime = S would. Each round bulk-
inserts --round no-op jobs and drains them with an in-process worker (4 threads)
that also prunes markers older than --keep-markers seconds, as workers do in
production. It prints the sizes after the first round ("start") and every
--every jobs after that.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--round", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--keep-markers", type=float, default=30.0)
    parser.add_argument("--vacuum-every", type=float, default=None, metavar="SECONDS")
    parser.add_argument(
        "--database", default=os.environ.get("JOBS_TEST_DB", "django_jobs") + "_bench"
    )
    args = parser.parse_args()

    import psycopg

    admin = {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "password": os.environ.get("PGPASSWORD", ""),
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        conn.execute(f'CREATE DATABASE "{args.database}"')
    os.environ["TEST_DB"] = "postgres"
    os.environ["TEST_DB_NAME"] = args.database
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["JOBS_TEST_SETTINGS"] = (
        f'{{"KEEP_MARKERS": {args.keep_markers}, "PRUNE_BATCH": 5000, '
        '"MAINTENANCE_INTERVAL": 1.0, "LISTEN": false}'
    )
    try:
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(**admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_jobs import enqueue_many
    from django_jobs.models import Job
    from django_jobs.worker import Worker

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        print(  # noqa: T201
            f"server autovacuum: {cursor.fetchone()[0]}; manual VACUUM every: "
            f"{args.vacuum_every or 'never'} s",
            flush=True,
        )
    last_vacuum = time.monotonic()

    def sizes() -> str:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_relation_size('django_jobs_job'), pg_indexes_size('django_jobs_job'), "
                "pg_total_relation_size('django_jobs_marker'), "
                "(SELECT count(*) FROM django_jobs_marker), "
                "(SELECT autovacuum_count FROM pg_stat_user_tables "
                "WHERE relname = 'django_jobs_job')"
            )
            heap, indexes, markers, marker_rows, vacuums = cursor.fetchone()
        manual = vacuums_done[0]
        return (
            f"jobs heap {heap / 1024:8.0f} KiB  jobs indexes {indexes / 1024:8.0f} KiB  "
            f"markers {markers / 1024:8.0f} KiB ({marker_rows} rows)  autovacuums {vacuums}  "
            f"manual vacuums {manual}"
        )

    vacuums_done = [0]
    # One long-lived worker, as in production: it prunes markers and keeps the jobs
    # table vacuumed when dead rows pile up, whatever autovacuum does.
    worker = Worker(concurrency=4, batch=500, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, name="bench-worker")
    thread.start()
    done, started, next_report = 0, time.monotonic(), args.every
    try:
        while done < args.jobs:
            if args.vacuum_every and time.monotonic() - last_vacuum >= args.vacuum_every:
                with connection.cursor() as cursor:
                    cursor.execute("VACUUM django_jobs_job")
                    cursor.execute("VACUUM django_jobs_marker")
                last_vacuum = time.monotonic()
                vacuums_done[0] += 1
            enqueue_many("tests.noop", [None] * args.round)
            while Job.objects.exists():
                time.sleep(0.02)
            done += args.round
            if done == args.round:
                print(f"start (after {done:>9,} jobs): {sizes()}", flush=True)  # noqa: T201
            elif done >= next_report or done >= args.jobs:
                rate = done / (time.monotonic() - started)
                print(  # noqa: T201
                    f"after {done:>9,} jobs ({rate:5.0f}/s): {sizes()}  "
                    f"worker vacuums {worker._ops.counters['vacuums']}",
                    flush=True,
                )
                next_report += args.every
    finally:
        worker.stop()
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
