"""The Tasks backend, at the path TASKS settings name: ``django_jobs.backend.JobsBackend``.

The public path of the backend and of ``enqueue_step`` (docs/tasks.md); both live in
``django_jobs.tasks.backend``. Importing this raises the same ImportError on
Django < 6.0.
"""

from django_jobs.tasks.backend import JobsBackend, enqueue_step

__all__ = ["JobsBackend", "enqueue_step"]
