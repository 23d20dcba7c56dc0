"""Signals django-jobs sends. Receivers live elsewhere (logging, metrics, your code).

Every signal is sent with ``sender`` set to the job's name (a str) and these
keyword arguments: ``job_id`` (UUID), ``name``, ``queue``. Others:

- ``job_enqueued``: ``duplicate`` (bool); sent once the job's transaction commits.
- ``job_started``: ``attempt``; sent by the worker thread about to run the handler.
- ``job_finished``: ``attempt``, ``outcome`` ("succeeded", "retried", "dead",
  "released" or "snoozed"), ``error`` (the exception or None), ``duration`` (seconds or None).
- ``job_dead_lettered``: ``reason`` (a DeadReason), ``attempts``, ``error`` (str).
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from django.dispatch import Signal

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
