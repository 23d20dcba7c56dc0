"""Moved to ``django_jobs.tasks.handlers`` (running a task: ``django_jobs.tasks.runner``)."""

from django_jobs.tasks.handlers import Policy, TaskHandler, check_payload, payload, register
from django_jobs.tasks.runner import send_enqueued

__all__ = ["Policy", "TaskHandler", "check_payload", "payload", "register", "send_enqueued"]
