"""factory-boy factories for rows the tests insert directly (bypassing enqueue)."""

import factory
from django.utils import timezone

from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, uuid7


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

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
