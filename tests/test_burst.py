"""`runjobs --burst` (issue 22, point 3): run what is due, then exit.

The exit condition is the database's view of due work (JobQuerySet.any_due): a
claim that came back short because another worker's claim held the rows, a lock
race or a flow limit is not "nothing due". Real `runjobs` processes on the
engine of the run (PostgreSQL with both claim paths, SQLite, MariaDB).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobs import control, enqueue, enqueue_many, job
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import unregister
from django_jobs.worker import Worker
from tests.conftest import ENGINE, POSTGRES, wait_for
from tests.factories import JobFactory
from tests.testapp import flow_jobs
from tests.testapp import jobs as handlers
from tests.testapp.models import Audit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Persistent connections: a reconnect per job would be most of the gap between two jobs.
FLOW_ENV = {"JOBS_TEST_FLOW": "1", "JOBS_CONN_MAX_AGE": "60"}
# Both claim paths on PostgreSQL; the other engines have one.
CLAIMS = ["auto", "orm"] if POSTGRES else ["auto"]


def _claim_env(claim):
    return {"JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim})}


@pytest.mark.mariadb
@pytest.mark.skipif(ENGINE != "mariadb", reason="MariaDB's run only")
@pytest.mark.parametrize("run", range(10))
def test_three_burst_workers_leave_no_due_job_behind_on_mariadb(worker_process, run):
    """The claim there reads due ids without locks, then locks them: racing claims can
    each come back empty while thousands of jobs wait. Ten runs: all must complete."""
    total = 300
    with transaction.atomic():
        for i in range(total):
            enqueue(handlers.record_atomic, {"label": f"job-{i}"})
    workers = [worker_process("--burst", "--concurrency", "4") for _ in range(3)]
    codes = [w.wait(timeout=300) for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    effects = Audit.objects.count()
    distinct = Audit.objects.values("job_id").distinct().count()
    assert (effects, distinct, CompletionMarker.objects.count()) == (total, total, total), (
        f"run {run}: {Job.objects.count()} jobs left"
    )
    assert Job.objects.count() == 0
    assert DeadLetter.objects.count() == 0


@pytest.mark.mariadb
@pytest.mark.parametrize("claim", CLAIMS)
def test_burst_workers_run_the_jobs_that_become_due_while_they_run(worker_process, claim):
    with transaction.atomic():
        enqueue(handlers.sleep, {"seconds": 3, "label": "long"})
        for i in range(30):
            enqueue(handlers.record, {"label": f"now-{i}"})
        for i in range(20):
            enqueue(handlers.record, {"label": f"later-{i}"}, delay=1.0)
    workers = [
        worker_process("--burst", "--concurrency", "2", extra_env=_claim_env(claim))
        for _ in range(3)
    ]
    codes = [w.wait(timeout=120) for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    # The worker that ran the long job was still there when the later jobs came due.
    assert Audit.objects.filter(label__startswith="later-").count() == 20
    assert Audit.objects.filter(label__startswith="now-").count() == 30
    assert Job.objects.count() == 0


@pytest.mark.mariadb
@pytest.mark.parametrize("claim", CLAIMS)
def test_a_burst_worker_leaves_what_is_not_due_for_it_and_exits(worker_process, claim):
    """Leased by a live worker, blocked behind it, paused, scheduled, unknown: not due.
    An expired lease is due: taken over."""
    now = timezone.now()
    held = JobFactory(
        leased=True, worker="elsewhere:1:aa", lease_expires_at=now + timedelta(hours=1)
    )
    blocked = enqueue(handlers.record, {"label": "blocked"}, after=[held.id])
    JobFactory(name="tests.record", payload='{"label": "expired"}', lease_expired=True)
    control.pause(["emails"])
    paused = enqueue(handlers.other_queue, {})
    scheduled = enqueue(handlers.record, {"label": "scheduled"}, delay=3600)
    unknown = JobFactory(name="tests.no_worker_has_this")
    for i in range(5):
        enqueue(handlers.record, {"label": f"due-{i}"})
    started = time.monotonic()
    worker = worker_process("--burst", "--concurrency", "2", extra_env=_claim_env(claim))
    assert worker.wait(timeout=60) == 0, worker.output()[-2000:]
    elapsed = time.monotonic() - started
    ran = set(Audit.objects.values_list("label", flat=True))
    assert ran == {"expired", *(f"due-{i}" for i in range(5))}
    left = set(Job.objects.values_list("id", flat=True))
    assert left == {held.id, blocked.id, paused.id, scheduled.id, unknown.id}
    assert Job.objects.get(id=held.id).locked_by == held.locked_by  # not taken over
    print(f"burst worker with nothing due left: exited after {elapsed:.1f}s")


@pytest.mark.mariadb
@pytest.mark.skipif(ENGINE == "sqlite", reason="SQLite has no row locks")
@pytest.mark.parametrize("claim", CLAIMS)
def test_a_burst_worker_waits_for_due_rows_another_transaction_holds(worker_process, claim):
    """Rows another claim (or settle) holds are skipped by the claim: an empty claim then
    is not "nothing due". The worker runs the free rows, waits, then runs the held ones."""
    with transaction.atomic():
        for i in range(20):
            enqueue(handlers.record, {"label": f"job-{i}"})
    # The last ten in claim order (MariaDB's claim passes at most a few held rows).
    order = Job.objects.order_by("-priority", "run_at", "id").values_list("id", flat=True)
    held = list(order)[10:]
    locked, release = threading.Event(), threading.Event()

    def hold_rows():
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id__in=held))
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_rows)
    holder.start()
    try:
        assert locked.wait(30)
        worker = worker_process("--burst", "--concurrency", "2", extra_env=_claim_env(claim))
        wait_for(lambda: Audit.objects.count() >= 10, timeout=60, message="the free rows")
        time.sleep(1.5)  # the worker's claims meet only held rows meanwhile
        still_running = worker.proc.poll() is None
    finally:
        release.set()
        holder.join()
    assert worker.wait(timeout=60) == 0, worker.output()[-2000:]
    assert still_running, "the worker left while due rows were held"
    assert Audit.objects.count() == 20
    assert Job.objects.count() == 0


# ---- flow limits (PostgreSQL) -----------------------------------------------------


@pytest.fixture
def flow_handlers():
    registered = flow_jobs.register()
    yield registered
    flow_jobs.unregister_all()


@pytest.mark.postgres
@pytest.mark.parametrize("claim", CLAIMS)
def test_three_burst_workers_run_every_rate_limited_job(flow_handlers, worker_process, claim):
    enqueue_many(flow_handlers["rated"], [{"label": str(i)} for i in range(100)])  # 20/s
    enqueue_many(flow_handlers["free"], [{"label": str(i)} for i in range(50)])
    env = {**FLOW_ENV, **_claim_env(claim)}
    workers = [worker_process("--burst", "--concurrency", "8", extra_env=env) for _ in range(3)]
    codes = [w.wait(timeout=120) for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    starts = [
        float(label.split("|")[1])
        for label in Audit.objects.filter(label__startswith="rated|").values_list(
            "label", flat=True
        )
    ]
    assert len(starts) == 100, f"{Job.objects.count()} jobs left"
    assert Audit.objects.filter(label__startswith="unlimited|").count() == 50
    assert Job.objects.count() == 0
    per_window: dict[int, int] = {}
    for at in starts:
        per_window[int(at // 1)] = per_window.get(int(at // 1), 0) + 1
    assert max(per_window.values()) <= 20, per_window


@pytest.mark.postgres
def test_a_burst_worker_sleeps_until_a_rate_window_admits_instead_of_spinning():
    def rated(payload, ctx):
        Audit.objects.create(label=f"rated-{payload['n']}", job_id=ctx.id)

    handler = job(name="tests.burst.rated", rate_limit="5/s")(rated)
    due_checks = []

    def count_due_checks(execute, sql, params, many, context):
        if "EXISTS" in sql.upper() or "LIMIT 1" in sql.upper():
            due_checks.append(time.monotonic())
        return execute(sql, params, many, context)

    try:
        enqueue_many(handler, [{"n": n} for n in range(12)])
        started = time.monotonic()
        with connection.execute_wrapper(count_due_checks):
            Worker(burst=True, concurrency=4, listen=False).run()
        elapsed = time.monotonic() - started
    finally:
        unregister("tests.burst.rated")
    assert Audit.objects.filter(label__startswith="rated-").count() == 12
    assert Job.objects.count() == 0
    # Twelve starts at 5 per window need a third window; the waits between are sleeps,
    # a few looks per window, not a loop on the database.
    assert 1.0 < elapsed < 10, elapsed
    assert len(due_checks) < 20 * elapsed, (len(due_checks), elapsed)
    print(f"5/s, 12 jobs: {elapsed:.1f}s, {len(due_checks)} looks at the due work")
