"""OpenTelemetry traces (issue 26): the real SDK, real `runjobs` processes, real rows.

The test process's spans (the request, the enqueue) go to an in-process provider
installed for one test and removed after it; the worker subprocesses' spans to a
JSON-lines file (tests/otel.py, turned on by JOBS_TEST_SPANS). The tests read
both and check the parent, child and link structure a trace viewer draws.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from django.db import transaction
from django.test import override_settings

from django_jobs import control, enqueue, enqueue_many, tracing, workflow
from django_jobs.fleet import WorkerBeat
from django_jobs.models import CompletionMarker, DeadLetter, Job
from tests import otel
from tests.conftest import ROOT, wait_for
from tests.testapp import jobs
from tests.testapp.models import Audit

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.util._once import Once  # noqa: E402 - after the importorskip

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans(tmp_path):
    """Install a real SDK tracer provider in this process for one test; yield its spans' reader."""
    path = tmp_path / "web.jsonl"
    # The API lets a process set its provider once: the SDK's own tests reset it so.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    provider = otel.provider(path)
    trace.set_tracer_provider(provider)
    assert tracing.active()
    yield lambda: otel.read(path)
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    assert not tracing.active()


def one(found, **wanted):
    """The one span of found whose fields match (attributes as attr_<name, "." as "__">)."""
    matches = [span for span in found if _matches(span, wanted)]
    assert len(matches) == 1, (wanted, [(s["name"], s["attributes"]) for s in found])
    return matches[0]


def _matches(span, wanted):
    for key, value in wanted.items():
        if key.startswith("attr_"):
            if span["attributes"].get(key[5:].replace("__", ".")) != value:
                return False
        elif span[key] != value:
            return False
    return True


def stop(worker):
    wait_for(lambda: WorkerBeat.objects.filter(pid=worker.pid).exists(), message="worker up")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]


@pytest.mark.mariadb
def test_a_request_its_enqueue_the_attempts_and_a_retry_form_one_linked_trace(
    spans, worker_process, tmp_path, client
):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders/", kind=trace.SpanKind.SERVER) as request:
        response = client.post("/orders/", {"item": "pen"})
        with transaction.atomic():
            flaky = enqueue(jobs.traced, {"label": "flaky", "succeed_on": 2})
    assert response.status_code == 200
    request_id = f"{request.get_span_context().span_id:016x}"
    trace_id = f"{request.get_span_context().trace_id:032x}"

    web = spans()
    record_job = Job.objects.get(name="tests.record")
    send_record = one(web, name="send default", attr_messaging__message__id=str(record_job.id))
    send_flaky = one(web, name="send default", attr_messaging__message__id=str(flaky.id))
    for send in (send_record, send_flaky):
        assert send["kind"] == "PRODUCER"
        assert send["parent_id"] == request_id and send["trace_id"] == trace_id
        assert send["attributes"]["messaging.system"] == "django_jobs"
        assert send["attributes"]["messaging.destination.name"] == "default"
        assert send["attributes"]["messaging.operation.type"] == "send"
    # The row holds the producer span's context, written by the INSERT itself.
    assert record_job.trace_context.startswith(f"00-{trace_id}-{send_record['span_id']}-")
    assert Job.objects.get(id=flaky.id).trace_context.split("-")[2] == send_flaky["span_id"]

    path = tmp_path / "worker.jsonl"
    worker = worker_process("--concurrency", "2", extra_env={"JOBS_TEST_SPANS": str(path)})
    wait_for(lambda: CompletionMarker.objects.count() == 2, timeout=60, message="both done")
    stop(worker)
    found = otel.read(path)

    process_record = one(
        found, name="process default", attr_messaging__message__id=str(record_job.id)
    )
    assert process_record["kind"] == "CONSUMER"
    assert process_record["trace_id"] == trace_id
    assert process_record["parent_id"] == send_record["span_id"]  # the first attempt: a child
    assert [link["span_id"] for link in process_record["links"]] == [send_record["span_id"]]
    attributes = process_record["attributes"]
    assert attributes["django_jobs.outcome"] == "succeeded"
    assert attributes["django_jobs.attempt"] == 1
    assert attributes["django_jobs.job.name"] == "tests.record"
    assert attributes["messaging.operation.type"] == "process"
    assert 0 <= attributes["django_jobs.queue_wait"] < 60
    assert process_record["status"] == "UNSET"

    first = one(
        found,
        name="process default",
        attr_django_jobs__attempt=1,
        attr_messaging__message__id=str(flaky.id),
    )
    second = one(
        found,
        name="process default",
        attr_django_jobs__attempt=2,
        attr_messaging__message__id=str(flaky.id),
    )
    assert first["parent_id"] == send_flaky["span_id"] and first["trace_id"] == trace_id
    assert first["attributes"]["django_jobs.outcome"] == "retried"
    assert first["status"] == "ERROR"
    [exception] = [e for e in first["events"] if e["name"] == "exception"]
    assert exception["attributes"]["exception.type"] == "RuntimeError"
    assert "traced failure on attempt 1" in exception["attributes"]["exception.message"]
    # The retry: a trace of its own, linked to the enqueue.
    assert second["parent_id"] is None and second["trace_id"] != trace_id
    assert [link["span_id"] for link in second["links"]] == [send_flaky["span_id"]]
    assert second["links"][0]["attributes"] == {"django_jobs.link": "producer"}
    assert second["attributes"]["django_jobs.outcome"] == "succeeded"
    print(otel.render(web + found))  # docs/observability.md shows this rendering
    # The handler's own spans nest under its attempt's.
    work = [span for span in found if span["name"] == "handler work"]
    assert sorted(span["parent_id"] for span in work) == sorted(
        [first["span_id"], second["span_id"]]
    )


@pytest.mark.mariadb
def test_an_async_handler_on_the_event_loop_runs_in_its_attempts_span(
    spans, worker_process, tmp_path
):
    with transaction.atomic():
        result = enqueue(jobs.traced_async, {"succeed_on": 2})
    send = one(spans(), name="send default", attr_messaging__message__id=str(result.id))
    path = tmp_path / "worker.jsonl"
    worker = worker_process(extra_env={"JOBS_TEST_SPANS": str(path)})
    wait_for(
        lambda: CompletionMarker.objects.filter(job_id=result.id).exists(),
        timeout=60,
        message="the async job's marker",
    )
    stop(worker)
    found = otel.read(path)
    first, second = (
        one(
            found,
            name="process default",
            attr_django_jobs__attempt=n,
            attr_messaging__message__id=str(result.id),
        )
        for n in (1, 2)
    )
    assert first["parent_id"] == send["span_id"] and first["trace_id"] == send["trace_id"]
    assert first["attributes"]["django_jobs.outcome"] == "retried"
    assert first["status"] == "ERROR"
    [exception] = [e for e in first["events"] if e["name"] == "exception"]
    assert "async traced failure on attempt 1" in exception["attributes"]["exception.message"]
    assert second["attributes"]["django_jobs.outcome"] == "succeeded"
    # The span the handler opens after an await, on the loop, is its attempt's child.
    work = [span for span in found if span["name"] == "async handler work"]
    assert sorted(span["parent_id"] for span in work) == sorted(
        [first["span_id"], second["span_id"]]
    )


@pytest.mark.mariadb
def test_workflow_steps_link_to_their_parents_and_run_under_their_own_create_spans(
    spans, worker_process, tmp_path
):
    with trace.get_tracer("tests").start_as_current_span("checkout"), workflow(name="order-7") as w:
        charge = w.enqueue(jobs.traced, {"label": "charge"})
        ship = w.enqueue(jobs.traced, {"label": "ship"}, after=[charge])
        mail = w.enqueue(jobs.traced, {"label": "mail"}, after=[charge, ship])
    web = spans()
    send = one(web, name="send")
    assert send["kind"] == "CLIENT"
    assert send["attributes"]["messaging.batch.message_count"] == 3
    assert send["attributes"]["django_jobs.workflow"] == "order-7"
    create = {
        result.id: one(web, name="create default", attr_messaging__message__id=str(result.id))
        for result in (charge, ship, mail)
    }
    for span in create.values():
        assert span["kind"] == "PRODUCER" and span["parent_id"] == send["span_id"]
    assert create[charge.id]["links"] == []
    assert [link["span_id"] for link in create[mail.id]["links"]] == [
        create[charge.id]["span_id"],
        create[ship.id]["span_id"],
    ]
    assert create[ship.id]["links"][0]["attributes"] == {"django_jobs.link": "parent"}

    path = tmp_path / "worker.jsonl"
    worker = worker_process(extra_env={"JOBS_TEST_SPANS": str(path)})
    wait_for(lambda: CompletionMarker.objects.count() == 3, timeout=60, message="the steps")
    stop(worker)
    found = otel.read(path)
    for result in (charge, ship, mail):
        process = one(found, name="process default", attr_messaging__message__id=str(result.id))
        assert process["parent_id"] == create[result.id]["span_id"]
        assert process["trace_id"] == send["trace_id"]


@pytest.mark.mariadb
def test_a_dead_letter_keeps_the_trace_and_its_replay_links_to_it(spans, run_worker):
    dead = enqueue(jobs.traced, {"label": "doomed", "fatal": True})
    run_worker()
    letter = DeadLetter.objects.get(id=dead.id)
    sent = one(spans(), name="send default", attr_messaging__message__id=str(dead.id))
    assert letter.trace_context.split("-")[2] == sent["span_id"]
    process = one(spans(), name="process default", attr_messaging__message__id=str(dead.id))
    assert process["attributes"]["django_jobs.outcome"] == "dead"
    assert process["attributes"]["django_jobs.dead_reason"] == "fatal"
    assert process["status"] == "ERROR"

    with trace.get_tracer("tests").start_as_current_span("admin replay") as operator:
        report = control.replay(DeadLetter.objects.filter(id=dead.id), by="tests")
    [(_letter, new_id)] = report.replayed.items()
    replay = one(spans(), name="send default", attr_messaging__message__id=str(new_id))
    assert replay["attributes"]["messaging.operation.name"] == "replay"
    assert replay["attributes"]["django_jobs.replay_of"] == str(dead.id)
    assert replay["parent_id"] == f"{operator.get_span_context().span_id:016x}"
    assert [(link["span_id"], link["attributes"]) for link in replay["links"]] == [
        (sent["span_id"], {"django_jobs.link": "dead letter"})
    ]
    assert Job.objects.get(id=new_id).trace_context.split("-")[2] == replay["span_id"]


def test_enqueue_many_is_one_span_whose_context_every_job_carries(spans):
    results = enqueue_many(jobs.noop, [{"n": n} for n in range(3)])
    send = one(spans(), name="send default")
    assert send["attributes"]["messaging.batch.message_count"] == 3
    contexts = {Job.objects.get(id=result.id).trace_context for result in results}
    assert len(contexts) == 1
    assert contexts.pop().startswith(f"00-{send['trace_id']}-{send['span_id']}-")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_write_after_another_databases_commit_is_parented_by_the_call(spans):
    from django_jobs import enqueue_on_commit

    with trace.get_tracer("tests").start_as_current_span("view") as view:
        with transaction.atomic(using="other"):
            result = enqueue_on_commit(jobs.noop, commit_of="other")
            assert not Job.objects.filter(id=result.id).exists()
    send = one(spans(), name="send default")
    assert send["parent_id"] == f"{view.get_span_context().span_id:016x}"
    assert Job.objects.get(id=result.id).trace_context.split("-")[2] == send["span_id"]


def test_a_failed_enqueue_records_its_error_on_the_span(spans):
    from django_jobs.exceptions import IdempotencyConflict

    enqueue(jobs.noop, {"a": 1}, key="k")
    with pytest.raises(IdempotencyConflict):
        enqueue(jobs.noop, {"a": 2}, key="k")
    failed = [span for span in spans() if span["status"] == "ERROR"]
    assert [span["name"] for span in failed] == ["send default"]
    assert failed[0]["events"][0]["attributes"]["exception.type"].endswith("IdempotencyConflict")


def test_tasks_backend_enqueues_through_the_same_spans(spans):
    tasks = pytest.importorskip("tests.testapp.tasks")
    with trace.get_tracer("tests").start_as_current_span("view") as view:
        result = tasks.add.enqueue(1, 2)
    send = one(spans(), name="send default")
    assert send["parent_id"] == f"{view.get_span_context().span_id:016x}"
    assert Job.objects.get(id=result.id).trace_context.split("-")[2] == send["span_id"]


def test_a_garbage_trace_context_makes_a_root_span_and_the_job_runs(spans, run_worker):
    result = enqueue(jobs.traced, {"label": "garbage"})
    Job.objects.filter(id=result.id).update(trace_context="00-not-a-trace context")
    run_worker()
    assert CompletionMarker.objects.filter(job_id=result.id).exists()
    process = one(spans(), name="process default", attr_messaging__message__id=str(result.id))
    assert process["parent_id"] is None and process["links"] == []


def test_tracing_false_turns_it_off_with_a_provider_set(spans, run_worker):
    with override_settings(DJANGO_JOBS={"TRACING": False}):
        assert not tracing.active()
        result = enqueue(jobs.noop)
    assert Job.objects.get(id=result.id).trace_context is None
    assert spans() == []


def test_tracing_must_be_a_boolean():
    from django_jobs.checks.configuration import check_settings

    with override_settings(DJANGO_JOBS={"TRACING": "yes"}):
        errors = [e for e in check_settings() if e.id == "django_jobs.E016"]
    assert len(errors) == 1 and "'yes'" in errors[0].msg


def test_without_a_provider_nothing_is_traced():
    assert not tracing.active()
    result = enqueue(jobs.noop)
    assert Job.objects.get(id=result.id).trace_context is None


# What runs in a process where `import opentelemetry` fails: enqueue, a worker, a replay.
_WITHOUT_OTEL = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Blocker())
import django
django.setup()
from django.core.management import call_command
from django_jobs import control, enqueue, tracing
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.worker import Worker

assert not tracing.active()
ok = enqueue("tests.noop")
dead = enqueue("tests.fatal")
Worker(burst=True, concurrency=1).run()
assert CompletionMarker.objects.filter(job_id=ok.id).exists()
control.replay(DeadLetter.objects.filter(id=dead.id), by="tests")
assert all(job.trace_context is None for job in Job.objects.all())
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
assert loaded == [], loaded
print("untraced ok")
"""


def test_without_the_api_importable_everything_works_and_nothing_imports_it():
    from django.db import connection

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("JOBS_TEST_SPANS", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_OTEL)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "untraced ok" in done.stdout
    assert Audit.objects.count() == 0  # (the handlers above write nothing)
