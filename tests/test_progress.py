"""ctx.progress() (issue 26): validated, throttled, written by real workers, kept at the end."""

from __future__ import annotations

import json
import math
import signal
import time
from io import StringIO

import pytest
from django.core.management import call_command
from hypothesis import given
from hypothesis import strategies as st

from django_jobs import enqueue, limits, progress
from django_jobs.context import JobContext
from django_jobs.fleet import WorkerBeat
from django_jobs.models import CompletionMarker, DeadLetter, Job
from tests.admin_fixtures import url
from tests.conftest import wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit


def context(report=None):
    from django.utils import timezone

    ctx = JobContext(
        id=__import__("uuid").uuid4(),
        name="n",
        queue="q",
        attempt=1,
        max_attempts=1,
        enqueued_at=timezone.now(),
    )
    ctx._report = report
    return ctx


# ---- the value --------------------------------------------------------------------


@given(
    done=st.integers(0, 2**60) | st.floats(0, 1e300),
    extra=st.none() | st.floats(0, 1e300),
    note=st.text(max_size=200).filter(str.isprintable),
)
def test_every_valid_report_is_stored_and_read_back(done, extra, note):
    total = None if extra is None else float(done) + extra
    if total == 0:
        total = None
    value = limits.progress(done, total, note)
    assert json.loads(json.dumps(value)) == value  # JSON as it is stored
    found = progress.read(value)
    assert found is not None and found.note == note
    assert found.fraction is None or 0 <= found.fraction <= 1


@pytest.mark.parametrize(
    ("done", "total", "note", "message"),
    [
        (-1, None, "", "done must be a finite number from 0"),
        (math.nan, None, "", "done must be a finite number from 0"),
        (math.inf, None, "", "done must be a finite number from 0"),
        (True, None, "", "done must be a finite number from 0"),
        ("3", None, "", "done must be a finite number from 0"),
        (3, 2, "", "must be at most total"),
        (0, 0, "", "must be at most total"),
        (1, -5, "", "total must be a finite number from 0"),
        (1, None, 7, "note must be text"),
        (1, None, "x" * 201, "at most 200 characters"),
        (1, None, "line\nbreak", "printable"),
    ],
)
def test_bad_reports_are_refused_with_a_clear_error(done, total, note, message):
    ctx = context(report=lambda value: pytest.fail("nothing may be written"))
    with pytest.raises(ValueError, match=message):
        ctx.progress(done, total, note)


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        {"done": "x"},
        {"done": -1},
        {"done": 1, "total": 0},
        {"done": 1, "note": 5},
        {"done": float("nan")},
    ],
)
def test_a_hand_edited_column_reads_as_no_progress(value):
    assert progress.read(value) is None


def test_a_tight_loop_hands_at_most_one_value_a_second_to_the_worker_and_flush_sends_the_last():
    sent = []
    ctx = context(report=sent.append)
    started = time.monotonic()
    for done in range(200_000):
        ctx.progress(done, 200_000)
    elapsed = time.monotonic() - started
    assert len(sent) <= 1 + elapsed / limits.PROGRESS_INTERVAL
    assert sent[0]["done"] == 0  # the first report goes at once
    ctx.flush_progress()
    assert sent[-1] == {"done": 199_999, "total": 200_000, "note": ""}
    ctx.flush_progress()  # nothing new: nothing sent
    assert sent[-1]["done"] == 199_999 and sent.count(sent[-1]) == 1


def test_progress_without_a_worker_is_kept_on_the_context_only():
    ctx = context()
    ctx.progress(3, 4, "rows")
    assert ctx._progress == {"done": 3, "total": 4, "note": "rows"}


# ---- real workers -------------------------------------------------------------------


def stop(worker):
    wait_for(lambda: WorkerBeat.objects.filter(pid=worker.pid).exists(), message="worker up")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]


@pytest.mark.django_db(transaction=True)
@pytest.mark.mariadb
def test_a_running_jobs_progress_is_in_its_row_the_admin_status_and_its_marker(
    worker_process, tmp_path, admin_client_
):
    go = tmp_path / "go"
    result = enqueue(jobs.progressing, {"total": 50_000, "go": str(go)})
    worker = worker_process()
    wait_for(
        lambda: Audit.objects.filter(label="progressing").exists(),
        timeout=60,
        message="the loop done",
    )
    # The last value of the loop: written at the attempt's next heartbeat at the
    # latest (LEASE / 3 = 10 s here); the first one at once.
    wait_for(
        lambda: (Job.objects.get(id=result.id).progress or {}).get("done") == 50_000,
        timeout=30,
        message="the loop's last value in the row",
    )
    row = Job.objects.get(id=result.id)
    assert row.progress == {"done": 50_000, "total": 50_000, "note": "row 50000"}

    page = admin_client_.get(url("runningjob_changelist")).content.decode()
    assert '<progress class="django-jobs-progress" max="1000" value="1000"' in page
    assert "50000/50000 (100%) row 50000" in page

    board = admin_client_.get(url("dashboard")).content.decode()
    assert f'data-job="{result.id}"' in board
    assert '<progress class="django-jobs-progress" max="50000" value="50000">' in board

    out = StringIO()
    call_command("jobs", "status", stdout=out)
    assert "Running jobs reporting progress" in out.getvalue()
    assert f"{result.id}" in out.getvalue() and "50000/50000 (100%) row 50000" in out.getvalue()
    out = StringIO()
    call_command("jobs", "status", "--json", stdout=out)
    [shown] = json.loads(out.getvalue())["progress"]
    assert shown["id"] == str(result.id) and shown["done"] == 50_000

    go.touch()
    wait_for(
        lambda: CompletionMarker.objects.filter(job_id=result.id).exists(),
        timeout=30,
        message="the marker",
    )
    stop(worker)
    # The report made just before returning survives into the marker.
    marker = CompletionMarker.objects.get(job_id=result.id)
    assert marker.progress == {"done": 50_000, "total": 50_000, "note": "finished"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.mariadb
def test_the_last_progress_of_a_dead_job_is_in_its_letter(worker_process):
    result = enqueue(jobs.progressing, {"total": 10, "fatal": True})
    worker = worker_process()
    wait_for(
        lambda: DeadLetter.objects.filter(id=result.id).exists(), timeout=60, message="the letter"
    )
    stop(worker)
    letter = DeadLetter.objects.get(id=result.id)
    assert letter.progress == {"done": 10, "total": 10, "note": "finished"}


@pytest.mark.django_db(transaction=True)
def test_async_handlers_report_progress_too(worker_process):
    result = enqueue(jobs.async_progressing, {"total": 1000})
    worker = worker_process()
    wait_for(
        lambda: CompletionMarker.objects.filter(job_id=result.id).exists(),
        timeout=60,
        message="the marker",
    )
    stop(worker)
    marker = CompletionMarker.objects.get(job_id=result.id)
    assert marker.progress == {"done": 1000, "total": 1000, "note": "async"}
