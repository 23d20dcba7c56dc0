"""python manage.py demo: place orders through the view, run a real worker, show what happened."""

import logging
import os
import shlex
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connections
from django.test import Client

from django_jobs.models import CompletionMarker, DeadLetter, Job
from shop import tasks
from shop.models import Charge, Email, Order


class Command(BaseCommand):
    help = "Show django-jobs working end to end on a fresh database."

    def add_arguments(self, parser):
        parser.add_argument(
            "--keep",
            action="store_true",
            help="Keep the existing database (by default the demo starts from a fresh one).",
        )

    def handle(self, *, keep, **options):
        db = settings.DATABASES["default"]
        if not keep and db["ENGINE"].endswith("sqlite3"):
            # The system checks opened (or created) the file: did an earlier run fill it?
            held = bool(connections["default"].introspection.table_names())
            connections.close_all()
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(db["NAME"] + suffix):
                    os.remove(db["NAME"] + suffix)
            if held:
                self.stdout.write(
                    f"Starting from a fresh database: deleted {db['NAME']} and what it held "
                    "(run `python3 dev.py demo --keep` to keep it next time)."
                )
        call_command("migrate", verbosity=0)
        User = get_user_model()  # noqa: N806
        if not User.objects.filter(username="admin").exists():
            User.objects.create_superuser("admin", "admin@example.com", "admin")

        self.title("1. Four orders are placed through the view (POST /orders/)")
        client = Client()
        logging.getLogger("django.request").setLevel(
            logging.CRITICAL
        )  # the failing view is on purpose
        for item, explode in [
            ("book", False),
            ("lamp", False),
            ("discontinued-widget", False),
            ("kite", True),
        ]:
            try:
                client.post(
                    "/orders/",
                    {
                        "email": "ada@example.com",
                        "item": item,
                        **({"explode": 1} if explode else {}),
                    },
                )
                self.line(f"order for {item!r}: committed with its 3 jobs and 1 Django task")
            except RuntimeError as exc:
                self.line(f"order for {item!r}: the view raised ({exc}); no order, no job")
        self.line(f"orders: {Order.objects.count()}, live jobs: {Job.objects.count()}")
        for job in Job.objects.order_by("enqueued_at"):
            self.line(f"  waiting  {job.name:<32} key={job.idempotency_key}")

        self.title("2. A real worker process runs them: python manage.py runjobs --burst")
        for round_ in range(1, 6):
            if not Job.objects.exists():
                break
            if round_ > 1:
                time.sleep(1.2)  # the failed charges retry after a 1 s backoff
            self.line(f"-- worker run {round_}")
            subprocess.run(
                [sys.executable, "manage.py", "runjobs", "--burst", "--concurrency", "2"],
                check=True,
                cwd=settings.BASE_DIR,
            )

        self.title("3. What happened")
        self.line(f"live jobs left: {Job.objects.count()}")
        self.line(f"completion markers: {CompletionMarker.objects.count()}")
        for marker in CompletionMarker.objects.order_by("completed_at"):
            self.line(
                f"  done     {marker.name:<32} attempts={marker.attempts} result={marker.result}"
            )
        self.line(f"emails sent: {Email.objects.count()}, cards charged: {Charge.objects.count()}")
        self.line(f"dead letters: {DeadLetter.objects.count()}")
        for letter in DeadLetter.objects.all():
            self.line(f"  dead     {letter.name:<32} reason={letter.reason} error={letter.error}")
        name = tasks.thank_customer.module_path
        self.line(f"Django task results ({name}.get_result):")
        for job_id in CompletionMarker.objects.filter(name=name).values_list("job_id", flat=True):
            result = tasks.thank_customer.get_result(str(job_id))
            self.line(f"  {result.status:<10} {result.return_value}")

        # The exact commands: from this folder, with the Python that has django_jobs installed.
        manage = f"{shlex.quote(sys.executable)} manage.py"
        self.title("Where to look")
        self.line("Start the site (from any folder, in a second terminal):")
        self.line(f"  cd {shlex.quote(str(settings.BASE_DIR))}")
        self.line(f"  {manage} runserver")
        self.line(
            "then open http://127.0.0.1:8000/admin/django_jobs/ (admin / admin): dead letters "
            "(every attempt's error, a replay action), jobs, markers, the dashboard."
        )
        self.line("To put the dead letter right: change the order's item (Shop > Orders), replay")
        self.line(f"the letter (its Replay button), and run there: {manage} runjobs --burst")
        self.line(f"Place more orders at http://127.0.0.1:8000/ and run there: {manage} runjobs")

    def title(self, text):
        self.stdout.write(self.style.MIGRATE_HEADING(f"\n{text}"))

    def line(self, text):
        self.stdout.write(text)
