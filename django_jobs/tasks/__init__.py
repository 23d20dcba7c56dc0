"""The backend of Django's Tasks framework (django.tasks, Django >= 6.0) on django-jobs.

``backend`` (JobsBackend, also ``django_jobs.backend``), ``handlers`` (a Task as
a registry entry), ``runner`` (running one on the worker, Django's task signals)
and ``results`` (TaskResults read from the job tables).

Nothing is imported here: the app's ready() imports every installed app's
``tasks`` module when a TASKS backend is django-jobs', this package included.
"""
