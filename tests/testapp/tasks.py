"""@task functions (Django's Tasks API) that the tests enqueue on django_jobs.backend.JobsBackend.

Autodiscovered like jobs.py when a TASKS backend is ours, so worker processes know them.
Needs Django >= 6.0; on older Django nothing imports this module.
"""

import os
import time

from asgiref.sync import sync_to_async
from django.dispatch import receiver
from django.tasks import task
from django.tasks.signals import task_enqueued, task_finished, task_started

from tests.testapp import async_jobs
from tests.testapp.models import Audit


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
def record(label):
    Audit.objects.create(label=label)
    return label


@task(priority=50)
def record_urgent(label):
    Audit.objects.create(label=label)
    return label


@task(queue_name="emails")
def send_email(to):
    Audit.objects.create(label=f"email:{to}")
    return to


@task
async def async_record(label):
    await sync_to_async(Audit.objects.create)(label=label)
    return f"async:{label}"


@task(takes_context=True)
def flaky(context, succeed_on):
    """Fail until attempt `succeed_on`; return the attempt and the workers that ran it."""
    Audit.objects.create(label=f"flaky:{context.attempt}", attempt=context.attempt)
    if context.attempt < succeed_on:
        raise RuntimeError(f"flaky failure on attempt {context.attempt}")
    return {"attempt": context.attempt, "workers": context.task_result.worker_ids}


@task
async def async_nap(seconds):
    """Await `seconds`; return how many such naps of this process awaited meanwhile."""
    return await async_jobs.nap({"seconds": seconds}, None)


@task(takes_context=True)
async def async_context(context):
    return context.attempt


@task
def explode(message):
    """Always fails; OPTIONS["TASKS"] in tests/settings.py gives it 2 attempts."""
    raise ValueError(message)


@task
def explode_big(size):
    """Fails with a message of size characters (bigger than a payload may be)."""
    raise ValueError("x" * size)


@task
def sleepy(seconds, label):
    Audit.objects.create(label=f"start:{label}")
    time.sleep(seconds)
    return label


@task
def bad_return():
    return {1, 2}


@task(backend="immediate")
def elsewhere():
    """A task of a backend that is not ours: the worker must never run it."""
    Audit.objects.create(label="elsewhere")


# Worker processes started with TASK_SIGNALS_AUDIT=1 note each Django task signal they send.
def _audit_signal(name, task_result):
    if os.environ.get("TASK_SIGNALS_AUDIT"):
        Audit.objects.create(
            label=f"signal:{name}:{task_result.status}:{task_result.id}:{os.getpid()}"
        )


@receiver(task_enqueued)
def _on_enqueued(sender, task_result, **kwargs):
    _audit_signal("enqueued", task_result)


@receiver(task_started)
def _on_started(sender, task_result, **kwargs):
    _audit_signal("started", task_result)


@receiver(task_finished)
def _on_finished(sender, task_result, **kwargs):
    _audit_signal("finished", task_result)
