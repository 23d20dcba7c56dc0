"""OpenTelemetry traces of enqueues and attempts (docs/observability.md).

It follows the messaging spans of the OpenTelemetry semantic conventions, v1.45.0:
a PRODUCER span ``send {queue}`` around each enqueue's write, whose W3C context
is stored in the job's row by the same INSERT (the ``trace_context`` column), and
a CONSUMER span ``process {queue}`` around each attempt. A first attempt is a
child of its producer span (one trace from the request to the handler); later
attempts start a trace of their own, linked to it.

Nothing here imports OpenTelemetry: tracing is on when the application has
imported ``opentelemetry.trace`` and set a tracer provider there, and the
``TRACING`` setting is not False. Off, each enqueue and attempt costs one look
in ``sys.modules``.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any, Protocol

from django_jobs import conf, lifecycle
from django_jobs.limits import MAX_TRACESTATE_LENGTH

SYSTEM = "django_jobs"  # messaging.system
SEMCONV = "1.45.0"  # the version of the semantic conventions these spans follow

_OFF: nullcontext[None] = nullcontext()


class Message(Protocol):
    """What a producer span reads and writes of a new job (rows.NewJob has it)."""

    id: Any
    name: str
    queue: str
    trace_context: str | None


class Attempt(Protocol):
    """What a consumer span reads of an attempt (worker.runs.Run has it)."""

    job: Any  # rows.ClaimedJob
    handler: Any  # registry.Handler
    cancel_requested: bool


def active() -> bool:
    """True when a tracer provider is set in OpenTelemetry and TRACING is not False."""
    module = sys.modules.get("opentelemetry.trace")
    if module is None:  # nobody imported the API: nobody can have configured it
        return False
    provider = module.get_tracer_provider()
    if isinstance(provider, (module.ProxyTracerProvider, module.NoOpTracerProvider)):  # noqa: UP038
        return False
    return conf.get("TRACING") is not False


_tracer: tuple[Any, Any] | None = None  # (provider, its tracer)


def _trace() -> Any:
    """The opentelemetry.trace module (imported already: active() said so)."""
    return sys.modules["opentelemetry.trace"]


def _get_tracer() -> Any:
    global _tracer
    trace = _trace()
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer("django_jobs", _version()))
    return _tracer[1]


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("django-durable-jobs")
    except PackageNotFoundError:
        return None


def current() -> Any:
    """The current OpenTelemetry context when tracing is on (to parent a later write), else None."""
    if not active():
        return None
    from opentelemetry import context

    return context.get_current()


# ---- the stored context: "<traceparent>" or "<traceparent> <tracestate>" ----------


def _encode(span: Any) -> str:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=_trace().set_span_in_context(span))
    parent = carrier["traceparent"]
    state = carrier.get("tracestate", "")
    # A traceparent has no space: the first one ends it. A tracestate over the W3C's
    # own limit is dropped, not cut (a cut one would not parse).
    return f"{parent} {state}" if state and len(state) <= MAX_TRACESTATE_LENGTH else parent


def span_context(text: str | None) -> Any:
    """The SpanContext stored as text (a job's trace_context), or None for none or garbage."""
    if not text:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent, _, state = text.partition(" ")
    carrier = {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}
    found = _trace().get_current_span(TraceContextTextMapPropagator().extract(carrier))
    context = found.get_span_context()
    return context if context.is_valid else None


def _link(text: str | None, kind: str) -> list[Any]:
    context = span_context(text)
    if context is None:
        return []
    return [_trace().Link(context, {"django_jobs.link": kind})]


def _messaging(operation: str, queue: str | None, name: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    return attributes


# ---- producer spans ---------------------------------------------------------------


def sending(jobs: Sequence[Message], *, parent: Any = None) -> Any:
    """A context manager: the PRODUCER span of writing jobs (of one queue, or several).

    Each job's trace_context is set to the span's context before the write. Off,
    a shared no-op context manager.
    """
    if not active():
        return _OFF
    return _sending(jobs, parent)


@contextmanager
def _sending(jobs: Sequence[Message], parent: Any) -> Iterator[None]:
    trace = _trace()
    queues = {job.queue for job in jobs}
    queue = next(iter(queues)) if len(queues) == 1 else None
    attributes = _messaging("send", queue, "send")
    if len(jobs) == 1:
        attributes["messaging.message.id"] = str(jobs[0].id)
        attributes["django_jobs.job.name"] = jobs[0].name
    else:
        attributes["messaging.batch.message_count"] = len(jobs)
    name = "send" if queue is None else f"send {queue}"
    with _get_tracer().start_as_current_span(
        name, context=parent, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        text = _encode(span)
        for job in jobs:
            job.trace_context = text
        yield


def sending_workflow(workflow: str, steps: Sequence[Any]) -> Any:
    """A context manager: the spans of writing a workflow's steps (rows.Step: job, parents).

    A CLIENT span ``send`` around the write and, in it, one PRODUCER span
    ``create {queue}`` per step, linked to the create spans of its parents in the
    same workflow; each step's trace_context is its create span's.
    """
    if not active():
        return _OFF
    return _sending_workflow(workflow, steps)


@contextmanager
def _sending_workflow(workflow: str, steps: Sequence[Any]) -> Iterator[None]:
    trace = _trace()
    tracer = _get_tracer()
    attributes = _messaging("send", None, "send")
    attributes["messaging.batch.message_count"] = len(steps)
    attributes["django_jobs.workflow"] = workflow
    with tracer.start_as_current_span("send", kind=trace.SpanKind.CLIENT, attributes=attributes):
        contexts: list[Any] = []
        for step in steps:
            job = step.job
            links = [
                trace.Link(contexts[parent], {"django_jobs.link": "parent"})
                for parent in step.parents
                if isinstance(parent, int)  # a step of this workflow (an index)
            ]
            created = _messaging("create", job.queue, "create")
            created["messaging.message.id"] = str(job.id)
            created["django_jobs.job.name"] = job.name
            created["django_jobs.workflow"] = workflow
            span = tracer.start_span(
                f"create {job.queue}",
                kind=trace.SpanKind.PRODUCER,
                attributes=created,
                links=links,
            )
            span.end()
            contexts.append(span.get_span_context())
            job.trace_context = _encode(span)
        yield


def replayed(letters: Iterable[Any], jobs: Mapping[Any, Message]) -> None:
    """Give each replayed job (by letter id) a PRODUCER span linked to its letter's trace.

    `letters` have id, name, queue and trace_context (the dead job's). Off, the
    jobs keep no context.
    """
    if not active():
        return
    trace = _trace()
    tracer = _get_tracer()
    for letter in letters:
        job = jobs.get(letter.id)
        if job is None:
            continue
        attributes = _messaging("send", job.queue, "replay")
        attributes["messaging.message.id"] = str(job.id)
        attributes["django_jobs.job.name"] = job.name
        attributes["django_jobs.replay_of"] = str(letter.id)
        span = tracer.start_span(
            f"send {job.queue}",
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
            links=_link(letter.trace_context, "dead letter"),
        )
        span.end()
        job.trace_context = _encode(span)


# ---- consumer spans: the worker calls this around each attempt ---------------------


def attempt(execute: Callable[[Any], lifecycle.Outcome], run: Attempt) -> lifecycle.Outcome:
    """Return execute(run): in a CONSUMER span ``process {queue}`` when tracing is on.

    The span notes the job, its attempt and the outcome the lifecycle gives
    what execute reported (succeeded, retried, dead with its reason, snoozed,
    released), and records the handler's exception. (The threads' attempts.)
    """
    if not active():
        return execute(run)
    with _consumer_span(run) as span:
        outcome = execute(run)
        _note(span, run, outcome)
        return outcome


async def aattempt(
    execute: Callable[[Any], Awaitable[lifecycle.Outcome]], run: Attempt
) -> lifecycle.Outcome:
    """``attempt`` for the event loop's attempts: await execute(run) in the same span.

    The span is current in the attempt's own task (its context), so the spans the
    handler makes across its awaits are its children.
    """
    if not active():
        return await execute(run)
    with _consumer_span(run) as span:
        outcome = await execute(run)
        _note(span, run, outcome)
        return outcome


def _consumer_span(run: Attempt) -> Any:
    """The CONSUMER span of one attempt, as a context manager that makes it current."""
    trace = _trace()
    job = run.job
    producer = span_context(job.trace_context)
    links = [] if producer is None else [trace.Link(producer, {"django_jobs.link": "producer"})]
    # A first attempt continues the producer's trace; a retry starts its own, linked.
    parent = None
    if producer is not None and job.attempts <= 1:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(producer))
    now = datetime.now(UTC)
    due = job.run_at if job.run_at is not None else job.enqueued_at
    attributes = _messaging("process", job.queue, "process")
    attributes.update(
        {
            "messaging.message.id": str(job.id),
            "messaging.client.id": job.worker_id,
            "django_jobs.job.name": job.name,
            "django_jobs.attempt": job.attempts,
            "django_jobs.max_attempts": job.max_attempts,
        }
    )
    if due is not None:
        # The time the job waited for a worker since it was due (since it was
        # enqueued, for a job due at once): the queue's delay, not its own.
        attributes["django_jobs.queue_wait"] = max(0.0, (now - _aware(due)).total_seconds())
    return _get_tracer().start_as_current_span(
        f"process {job.queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    )


def _note(span: Any, run: Attempt, outcome: lifecycle.Outcome) -> None:
    try:
        _note_outcome(span, run, outcome)
    except Exception:  # noqa: BLE001 - a span's notes never fail an attempt
        span.set_attribute("django_jobs.outcome", "unknown")


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _note_outcome(span: Any, run: Attempt, outcome: lifecycle.Outcome) -> None:
    transition = lifecycle.on_outcome(
        run.job, outcome, policy=run.handler, cancel_requested=run.cancel_requested
    )
    exc = getattr(outcome, "exc", None)
    if isinstance(transition, lifecycle.Complete | lifecycle.Completed):
        name = "skipped" if getattr(transition, "skipped", False) else "succeeded"
    elif isinstance(transition, lifecycle.Retry):
        name = "retried"
    elif isinstance(transition, lifecycle.DeadLetter):
        name = "dead"
        span.set_attribute("django_jobs.dead_reason", transition.reason)
        exc = exc or (transition.exc if isinstance(transition.exc, BaseException) else None)
    elif isinstance(transition, lifecycle.SnoozeFor):
        name = "snoozed"
        span.set_attribute("django_jobs.snooze", transition.seconds)
    elif isinstance(transition, lifecycle.Release):
        name = "released"
    else:
        name = "abandoned"
    span.set_attribute("django_jobs.outcome", name)
    trace = _trace()
    if exc is not None:
        span.record_exception(exc)
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    elif name in ("retried", "dead", "abandoned"):
        span.set_status(trace.Status(trace.StatusCode.ERROR, name))
