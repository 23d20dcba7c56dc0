"""Payloads and results near the database's limits: every outcome is still recorded."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection

from django_jobs import InvalidPayload, enqueue, enqueue_many
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.store.mysql import ROW_OVERHEAD, STATEMENT_OVERHEAD
from django_jobs.store.settle import LETTER_PAYLOAD_SENT
from tests.conftest import ENGINE
from tests.testapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]

mariadb_only = pytest.mark.skipif(ENGINE != "mariadb", reason="MariaDB's max_allowed_packet")


def _payload_of(size):
    """Return a payload whose stored JSON text is `size` bytes long."""
    return {"blob": "x" * (size - len('{"blob":""}'))}


@pytest.fixture
def unlimited_payloads(settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "MAX_PAYLOAD_BYTES": 2**30}


def _max_allowed_packet():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        return cursor.fetchone()[0]


def _retried_database_errors(caplog):
    return [r.getMessage() for r in caplog.records if "database error" in r.getMessage()]


@pytest.mark.mariadb
def test_a_large_payload_s_dead_letter_keeps_its_reason_and_payload(
    unlimited_payloads, run_worker, caplog
):
    payload = _payload_of(LETTER_PAYLOAD_SENT + 1000)  # copied on the server, on every engine
    job_id = enqueue(jobs.fatal, payload).id
    caplog.set_level(logging.INFO, "django_jobs")
    worker = run_worker()
    assert worker.stats.dead == 1
    letter = DeadLetter.objects.get()
    assert (letter.id, letter.reason, letter.attempts) == (job_id, DeadReason.FATAL, 1)
    assert "this cannot succeed" in letter.error
    assert json.loads(letter.payload) == payload
    assert not Job.objects.exists()
    assert not _retried_database_errors(caplog)


@pytest.mark.mariadb
@mariadb_only
def test_the_largest_payload_enqueue_takes_dies_fatal_not_attempts_exhausted(
    unlimited_payloads, run_worker, caplog
):
    # The letter adds its errors and traceback to the payload: sent back whole, the
    # statement went over max_allowed_packet (error 1153), was retried as a lost
    # connection, and the job ended as attempts_exhausted.
    assert _max_allowed_packet() == 16 * 1024 * 1024
    largest = _max_allowed_packet() - ROW_OVERHEAD - STATEMENT_OVERHEAD  # as sent: 4 quotes
    payload = _payload_of(largest - 4)
    job_id = enqueue(jobs.fatal, payload).id
    stored = Job.objects.get().payload
    assert len(stored) == largest - 4
    caplog.set_level(logging.INFO, "django_jobs")
    worker = run_worker(lease=10, poll_interval=0.5)
    assert (worker.stats.dead, worker.stats.reexecuted) == (1, 0)
    letter = DeadLetter.objects.get()
    assert (letter.id, letter.reason, letter.attempts) == (job_id, DeadReason.FATAL, 1)
    assert "this cannot succeed" in letter.error
    assert letter.errors[-1]["message"] == "this cannot succeed"
    assert letter.payload == stored and json.loads(letter.payload) == payload
    assert not Job.objects.exists()
    assert not _retried_database_errors(caplog)


@pytest.mark.mariadb
@mariadb_only
@pytest.mark.parametrize("text", ["x", '"', "é"])
def test_a_payload_whose_insert_is_over_max_allowed_packet_is_refused_at_enqueue(
    unlimited_payloads, text
):
    # The 16,776,000 bytes: its INSERT fitted, by a few hundred bytes, and
    # no letter could; a payload of escaped quotes or of 2-byte characters fits less.
    packet = _max_allowed_packet()
    chars = {"x": 16_776_000, '"': packet // 4, "é": packet // 2}[text]
    enqueue(jobs.noop, {"label": "before"})
    with pytest.raises(InvalidPayload, match=r"over|longer than the server's max_allowed_packet"):
        enqueue(jobs.fatal, {"blob": text * chars})
    with pytest.raises(InvalidPayload, match=r"^job 1: payload is \d+ bytes"):
        enqueue_many(jobs.fatal, [{"n": 1}, {"blob": text * chars}])
    # Nothing written, and the connection is still fine (no error 1153 dropped it).
    assert list(Job.objects.values_list("name", flat=True)) == ["tests.noop"]


@pytest.mark.mariadb
@mariadb_only
def test_tags_and_metadata_count_against_max_allowed_packet(unlimited_payloads):
    # The largest payload that fits alone, with the most tags and metadata (~40 kB of
    # "é"): their INSERT is over max_allowed_packet, refused before anything is sent.
    largest = _max_allowed_packet() - ROW_OVERHEAD - STATEMENT_OVERHEAD
    payload = _payload_of(largest - 4)
    tags = [f"{i:02}" + "é" * 62 for i in range(16)]
    meta = {f"k{i:02}": "é" * 200 for i in range(16)}
    with pytest.raises(InvalidPayload, match=r"longer than the server's max_allowed_packet"):
        enqueue(jobs.noop, payload, tags=tags, meta=meta)
    with pytest.raises(InvalidPayload, match=r"^job 1: payload is \d+ bytes"):
        enqueue_many(jobs.noop, [{"n": 1}, payload], tags=tags, meta=meta)
    assert not Job.objects.exists()
    # Without them it fits, as the test above says.
    enqueue(jobs.noop, payload)
    assert Job.objects.count() == 1


@pytest.mark.mariadb
def test_enqueue_many_splits_its_inserts_under_max_allowed_packet():
    # 500 payloads of 40 kB (within the default MAX_PAYLOAD_BYTES) made one INSERT
    # of 20 MB: MariaDB refused it (error 1153) and dropped the connection.
    results = enqueue_many(jobs.record, [{"label": f"{i:03}" + "x" * 40_000} for i in range(500)])
    assert len(results) == Job.objects.count() == 500
    assert sorted(
        json.loads(p)["label"][:3] for p in Job.objects.values_list("payload", flat=True)
    ) == [f"{i:03}" for i in range(500)]


@pytest.mark.mariadb
@mariadb_only
def test_a_statement_over_max_allowed_packet_is_refused_not_retried(run_worker, caplog):
    # A result larger than max_allowed_packet cannot be written by any retry: its
    # settle is a failed attempt with the server's error, and the worker goes on.
    job_id = enqueue(jobs.big_result, {"chars": _max_allowed_packet() + 1}).id
    enqueue(jobs.noop, {})
    caplog.set_level(logging.INFO, "django_jobs")
    worker = run_worker(lease=10, poll_interval=0.5)
    assert (worker.stats.succeeded, worker.stats.dead, worker.stats.reexecuted) == (1, 1, 0)
    letter = DeadLetter.objects.get()
    assert (letter.id, letter.reason) == (job_id, DeadReason.ATTEMPTS_EXHAUSTED)
    assert "max_allowed_packet" in letter.error
    assert CompletionMarker.objects.count() == 1  # the other job's
    assert not _retried_database_errors(caplog)
