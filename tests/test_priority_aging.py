"""Priority aging: DJANGO_JOBS["PRIORITY_AGING"], a waiting job claimed as if its priority
rose one step per interval it has been due (store/aging.py).

Claim order against a model of it on every claim path, the system check, the claim's plan
on PostgreSQL, and starvation with a real worker: a steady flood of priority-10 jobs and
one priority-0 job, which runs within the aging bound (and never, without aging).
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_jobs import enqueue, enqueue_many
from django_jobs.checks.configuration import check_settings
from django_jobs.models import Job
from django_jobs.rows import ClaimRequest
from django_jobs.store import JobStore, pgrun, sql
from tests.conftest import ENGINE, POSTGRES, wait_for
from tests.factories import JobFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

STEP = 600  # seconds per priority step in the ordering tests


def aging(seconds, **more):
    return override_settings(
        DJANGO_JOBS={**settings.DJANGO_JOBS, "PRIORITY_AGING": seconds, **more}
    )


@pytest.fixture(params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request):
    return request.param


def claim_all(limit, token="w:1:a"):
    order = []
    for n in range(1000):
        batch = JobStore().claim(
            ClaimRequest(queues=["default"], limit=limit, token=f"{token}#{n}", lease=60)
        )
        if not batch:
            return order
        # A claim returns its jobs in plain priority order: what was taken is the point.
        order.append({job.id for job in batch})
    raise AssertionError("the claims never ran out")


# ---- the check ----


@pytest.mark.parametrize("value", [0, -1, 0.5, "10m", True, float("nan"), 1e12, [600]])
def test_a_bad_setting_is_refused_by_the_check(value):
    with override_settings(DJANGO_JOBS={"PRIORITY_AGING": value}):
        ids = [m.id for m in check_settings()]
    assert "django_jobs.E017" in ids


@pytest.mark.parametrize("value", [None, 1, 600, 2.5, timedelta(minutes=10)])
def test_good_settings_pass_the_check(value):
    with override_settings(DJANGO_JOBS={"PRIORITY_AGING": value}):
        assert "django_jobs.E017" not in [m.id for m in check_settings()]


# ---- claim order ----


def test_off_by_default_the_claim_is_strict_priority_order(claim_path):
    now = timezone.now()
    old = JobFactory(priority=0, run_at=now - timedelta(days=3))
    new = JobFactory(priority=1, run_at=now)
    with override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "CLAIM": claim_path}):
        assert claim_all(1) == [{new.id}, {old.id}]
    # The statement is the plain one: no level walk, no aging parameter.
    assert "RECURSIVE" not in sql.CLAIM and "%(aging)s" not in sql.CLAIM
    assert "RECURSIVE" not in sql.CLAIM_UNLIMITED


def test_a_job_waiting_long_enough_is_claimed_before_higher_priorities(claim_path):
    now = timezone.now()
    old = JobFactory(priority=0, run_at=now - timedelta(seconds=2 * STEP + 100))  # 0 + 2
    high = JobFactory(priority=2, run_at=now - timedelta(seconds=60))  # 2 + 0: a tie, younger
    mid = JobFactory(priority=1, run_at=now - timedelta(seconds=100))  # 1 + 0
    later = JobFactory(priority=50, run_at=now + timedelta(hours=1))  # not due
    with aging(STEP, CLAIM=claim_path):
        assert claim_all(1) == [{old.id}, {high.id}, {mid.id}]
    assert Job.objects.get(id=later.id).locked_by is None


def test_the_claim_order_matches_the_model_across_levels_and_batches(claim_path):
    rng = random.Random(27)
    now = timezone.now()
    made = []
    for _ in range(60):
        priority = rng.randint(-3, 6)
        # Ages away from step boundaries, so that the seconds the test takes do not matter.
        age = rng.randint(0, 8) * STEP + STEP // 2 + rng.randint(-200, 200)
        made.append(JobFactory(priority=priority, run_at=now - timedelta(seconds=age)))
    for _ in range(5):  # scheduled ahead at a high level: never taken
        JobFactory(priority=6, run_at=now + timedelta(hours=1))

    def effective(job):
        return job.priority + int((now - job.run_at).total_seconds() // STEP)

    model = sorted(made, key=lambda job: (-effective(job), job.run_at, job.id))
    with aging(STEP, CLAIM=claim_path):
        batches = claim_all(7)
    expected = [{job.id for job in model[start : start + 7]} for start in range(0, 60, 7)]
    assert batches == expected


def test_names_the_worker_lacks_and_excluded_names_are_left_alone_under_aging(claim_path):
    now = timezone.now()
    known = JobFactory(name="tests.noop", priority=0, run_at=now - timedelta(seconds=STEP * 3))
    JobFactory(name="tests.other", priority=5, run_at=now - timedelta(seconds=STEP * 3))
    with aging(STEP, CLAIM=claim_path):
        got = JobStore().claim(
            ClaimRequest(
                queues=["default"], limit=5, token="w:1:a#1", lease=60, names=["tests.noop"]
            )
        )
    assert [job.id for job in got] == [known.id]


def test_expired_leases_still_come_first_under_aging(claim_path):
    now = timezone.now()
    abandoned = JobFactory(lease_expired=True, priority=-5)
    JobFactory(priority=0, run_at=now - timedelta(seconds=STEP * 20))
    with aging(STEP, CLAIM=claim_path):
        [got] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w:1:a#9", lease=60)
        )
    assert got.id == abandoned.id


@pytest.mark.postgres
def test_the_unlimited_half_of_a_flow_claim_ages_too():
    now = timezone.now()
    old = JobFactory(priority=0, run_at=now - timedelta(seconds=STEP * 5 + 100))
    JobFactory(priority=3, run_at=now)
    limited = JobFactory(name="tests.capped", priority=9, run_at=now - timedelta(days=1))
    params = {
        **sql.claim_params(["default"], 1, "w:1:a#1", 60),
        "limited": ["tests.capped"],
        "aging": float(STEP),
    }
    rows = pgrun.run("default", sql.CLAIM_UNLIMITED_AGED, params)
    assert [row[0] for row in rows] == [old.id]
    assert Job.objects.get(id=limited.id).locked_by is None


# ---- the plan (PostgreSQL) ----


@pytest.mark.postgres
def test_the_aged_claim_walks_the_claim_index():
    """EXPLAIN of the aged claim on 50,000 waiting jobs of 5 priorities (and 5,000 on
    another queue): every read of django_jobs_job is an index scan, of the claim index
    for the levels and the due jobs; no sequential scan, no sort of the table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, enqueued_at,
                                         attempts, max_attempts, errors, waiting_for, dependents)
            SELECT gen_random_uuid(), 'tests.noop',
                   CASE WHEN n % 11 = 0 THEN 'other' ELSE 'default' END, '{}',
                   (n % 5) * 2, now() - (n || ' seconds')::interval, now(), 0, 3, '[]', 0, 0
            FROM generate_series(1, 55000) AS n
            """
        )
        cursor.execute("ANALYZE django_jobs_job")
        params = {**sql.claim_params(["default"], 10, "w:1:a#1", 60), "aging": 600.0}
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql.CLAIM_AGED, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    scans = []

    def walk(node):
        if node.get("Relation Name") == "django_jobs_job":
            scans.append((node["Node Type"], node.get("Index Name")))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    kinds = {kind for kind, _index in scans}
    assert "Seq Scan" not in kinds, scans
    assert ("Index Scan", "django_jobs_job_claim") in scans or (
        "Index Only Scan",
        "django_jobs_job_claim",
    ) in scans, scans
    # And it claims what a full sort by effective priority puts first.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM django_jobs_job WHERE queue = 'default' ORDER BY priority + "
            "floor(extract(epoch FROM now() - run_at) / 600) DESC, run_at, id LIMIT 1"
        )
        [best] = cursor.fetchone()
    with aging(600):
        [first] = JobStore().claim(
            ClaimRequest(queues=["default"], limit=1, token="w:1:a#2", lease=60)
        )
    assert first.id == best
    assert first.priority == 8  # the oldest of level 8: 8 + floor(54,999 / 600) = 99


# ---- starvation, with a real worker ----


def run_flood(worker_process, settings_json, seconds, pending=8):
    """Start one worker (concurrency 1) on a flood of `pending` priority-10 jobs (about
    20 ms each) that each enqueue their successor as they finish (tests.flood), so that
    as many wait all along; enqueue one priority-0 job once the flood runs; return the
    seconds from that enqueue to the low job's start (None: it never ran within
    `seconds`), and how many high jobs ran meanwhile. Asserts the flood was live to the
    end: a high job started in the last 2 s before the low one (or the deadline).

    The successors are written by the jobs themselves, not by a thread beside the
    worker: on SQLite such a thread waits for its turn to write behind the worker's
    claims and settles, the flood runs dry for an instant, and the low job gets in."""
    until = time.time() + seconds + 30
    enqueue_many(jobs.flood, [{"sleep": 0.02, "until": until}] * pending, priority=10)
    worker = worker_process(
        "--concurrency", "1", extra_env={"JOBS_TEST_SETTINGS": json.dumps(settings_json)}
    )
    try:
        wait_for(lambda: Audit.objects.filter(label="high").count() >= 20, timeout=60)
        enqueued = timezone.now()
        low = enqueue(jobs.record, {"label": "low"}, priority=0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ran = Audit.objects.filter(label="low", job_id=low.id).first()
            if ran is not None:
                break
            time.sleep(0.1)
        else:
            ran = None
        end = timezone.now() if ran is None else ran.created_at
        ran_high = Audit.objects.filter(label="high", created_at__gt=enqueued, created_at__lt=end)
        last = ran_high.order_by("-created_at").values_list("created_at", flat=True).first()
        assert last is not None and (end - last).total_seconds() < 2, "the flood ran dry"
        highs = ran_high.count()
        return (None if ran is None else (ran.created_at - enqueued).total_seconds()), highs
    finally:
        worker.stop()


@pytest.mark.slow
def test_without_aging_the_flood_starves_the_low_job(worker_process):
    started, highs = run_flood(worker_process, {}, seconds=6)
    assert started is None, "the low job ran while priority-10 jobs were waiting"
    assert highs >= 10  # the flood was real (and live to the end: run_flood checks)


@pytest.mark.slow
@pytest.mark.parametrize("claim", ["auto", "orm"] if POSTGRES else ["auto"])
def test_with_aging_the_low_job_runs_within_the_aging_bound(worker_process, claim):
    # One step a second: a priority-0 job outranks fresh priority-10 jobs (waiting well
    # under a second each) once it has waited 11 seconds, and not before 10.
    started, highs = run_flood(worker_process, {"PRIORITY_AGING": 1, "CLAIM": claim}, seconds=30)
    assert started is not None, "the low job starved"
    print(f"aging 1 s/step ({claim}): the low job started {started:.2f} s in, after {highs} highs")
    assert 10 <= started <= 14, started
    assert highs >= 20  # the flood was real (and live to the end: run_flood checks)


@pytest.mark.slow
def test_three_workers_claiming_aged_jobs_run_each_exactly_once(worker_process):
    rng = random.Random(5)
    now = timezone.now()
    for n in range(300):
        enqueue(
            jobs.record_atomic,
            {"label": f"j{n}"},
            priority=rng.randint(-2, 4),
            run_at=now - timedelta(seconds=rng.randint(0, 30)),
        )
    env = {"JOBS_TEST_SETTINGS": json.dumps({"PRIORITY_AGING": 1})}
    workers = [worker_process("--burst", "--concurrency", "3", extra_env=env) for _ in range(3)]
    for worker in workers:
        assert worker.wait(120) == 0, worker.output()
    labels = list(Audit.objects.values_list("label", flat=True))
    assert sorted(labels) == sorted(f"j{n}" for n in range(300))  # each once
    assert Job.objects.count() == 0


# ---- claims side by side ----


@pytest.mark.skipif(ENGINE == "sqlite", reason="SQLite has one writer: no claim beside another")
@pytest.mark.parametrize("claim", ["auto", "orm"] if POSTGRES else ["auto"])
@pytest.mark.parametrize("step", [None, 600])
def test_a_claim_beside_one_in_flight_takes_the_next_due_jobs(step, claim):
    """The aged claim reads its candidates unlocked, then locks them SKIP LOCKED: a claim
    beside another one in flight found the same first jobs, skipped them all and came
    back empty with 15 jobs due (found by r27); the plain claim goes on past them."""
    for _ in range(20):
        JobFactory()
    held, done = threading.Event(), threading.Event()
    got = {}

    def first():
        try:
            with aging(step, CLAIM=claim), transaction.atomic():  # its locks, held open
                request = ClaimRequest(queues=["default"], limit=5, token="a:1:a#1", lease=60)
                got["a"] = JobStore().claim(request)
                held.set()
                done.wait(10)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.wait(10)
        with aging(step, CLAIM=claim):
            request = ClaimRequest(queues=["default"], limit=5, token="b:1:b#1", lease=60)
            second = JobStore().claim(request)
    finally:
        done.set()
        thread.join(10)
    assert len(got["a"]) == 5
    assert len(second) == 5 and not {j.id for j in second} & {j.id for j in got["a"]}
