"""Signals django-jobs sends. Receivers live elsewhere (logging, metrics, your code).

Every signal is sent with ``sender`` set to the job's name (a str) and these
keyword arguments: ``job_id`` (UUID), ``name``, ``queue``. Others:

- ``job_enqueued``: ``duplicate`` (bool); sent once the job's transaction commits.
- ``job_started``: ``attempt``; sent by the worker thread about to run the handler.
- ``job_finished``: ``attempt``, ``outcome`` ("succeeded", "retried", "dead",
  "released" or "snoozed"), ``error`` (the exception or None), ``duration`` (seconds or None).
- ``job_dead_lettered``: ``reason`` (a DeadReason), ``attempts``, ``error`` (str).

django-jobs sends each of them through :func:`send`: a receiver that raises is
logged (logger ``django_jobs.signals``) and never fails the enqueue, the job or
the worker, and the other receivers still run.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Protocol

from django.dispatch import Signal

logger = logging.getLogger(__name__)

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_dead_lettered = Signal()


class _Job(Protocol):
    @property
    def id(self) -> uuid.UUID: ...
    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...


def about(job: _Job) -> dict[str, Any]:
    """Return the arguments every signal carries for job: sender, job_id, name and queue."""
    return {"sender": job.name, "job_id": job.id, "name": job.name, "queue": job.queue}


def send(signal: Signal, **kwargs: Any) -> None:
    """Send signal to every receiver; one that raises is logged, with its traceback."""
    for receiver, response in signal.send_robust(**kwargs):
        if isinstance(response, Exception):
            logger.error(
                "a receiver of django_jobs signal %s (%s) raised %s",
                _name_of(signal),
                getattr(receiver, "__qualname__", None) or type(receiver).__qualname__,
                type(response).__qualname__,
                exc_info=(type(response), response, response.__traceback__),
            )


def _name_of(signal: Signal) -> str:
    return next((name for name, value in globals().items() if value is signal), "?")
