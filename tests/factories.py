"""factory-boy factories for rows the tests insert directly (bypassing enqueue)."""

from datetime import timedelta

import factory
from django.utils import timezone

from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, WorkerBeat
from django_jobs.rows import uuid7


def _in(seconds: float):
    return factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=seconds))


class JobFactory(factory.django.DjangoModelFactory):
    """A live job: waiting by default; `leased=True` running, `lease_expired=True` abandoned.

    A leased job is held by `worker` (a worker id, host:pid:random) under the token
    "worker#claim_seq", its lease ending in 30 s (a minute ago when expired), one attempt counted.
    """

    class Meta:
        model = Job

    class Params:
        worker = "w:1:a"
        claim_seq = 1
        leased = factory.Trait(
            locked_by=factory.LazyAttribute(lambda o: f"{o.worker}#{o.claim_seq}"),
            lease_expires_at=_in(30),
            attempts=1,
        )
        lease_expired = factory.Trait(leased=True, lease_expires_at=_in(-60))

    id = factory.LazyFunction(uuid7)
    name = "tests.noop"
    queue = "default"
    payload = "{}"
    priority = 0
    run_at = factory.LazyFunction(timezone.now)
    enqueued_at = factory.LazyFunction(timezone.now)
    attempts = 0
    max_attempts = 3
    errors = factory.LazyFunction(list)


class WorkerBeatFactory(factory.django.DjangoModelFactory):
    """A worker's heartbeat row, seen just now (pass last_seen_at for a stale one)."""

    class Meta:
        model = WorkerBeat

    host = "h"
    pid = factory.Sequence(lambda n: n + 1)
    id = factory.LazyAttributeSequence(lambda o, n: f"{o.host}:{o.pid}:{n:04x}")
    queues = factory.LazyFunction(lambda: ["default"])
    concurrency = 4
    started_at = _in(-3600)
    last_seen_at = factory.LazyFunction(timezone.now)


class MarkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CompletionMarker

    job_id = factory.LazyFunction(uuid7)
    key = factory.LazyAttribute(lambda o: str(o.job_id))
    name = "tests.noop"
    queue = "default"
    enqueued_at = factory.LazyFunction(timezone.now)
    completed_at = factory.LazyFunction(timezone.now)


class DeadLetterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DeadLetter

    id = factory.LazyFunction(uuid7)
    name = "tests.record"
    queue = "default"
    payload = '{"label": "dead"}'
    attempts = 3
    max_attempts = 3
    reason = DeadReason.ATTEMPTS_EXHAUSTED
    error = "builtins.RuntimeError: boom"
    enqueued_at = factory.LazyFunction(timezone.now)
    dead_at = factory.LazyFunction(timezone.now)
