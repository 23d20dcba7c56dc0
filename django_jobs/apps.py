from importlib.util import find_spec

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    label = "django_jobs"
    verbose_name = _("Jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Everything is wired from here, the top of the package, so that no lower module
        # imports a higher one (tests/test_layers.py).
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from django_jobs import api, checks, conf, registry, sqlite  # noqa: F401 - checks register themselves

        # SQLite as the jobs database: IMMEDIATE transactions and WAL on its connections.
        connection_created.connect(sqlite.configure, dispatch_uid="django_jobs.sqlite")
        registry.connect_enqueue(api.enqueue, api.enqueue_on_commit)
        registry.autodiscover()
        # When a TASKS backend is django-jobs' (Django >= 6.0), every app's tasks module
        # declares handlers too: its @task functions are the handlers of Django's Tasks.
        if find_spec("django.tasks") is not None:
            from django_jobs.tasks.backend import configured_aliases

            if configured_aliases():
                autodiscover_modules("tasks")
        # The enqueue counter (the admin registers itself: django_jobs.admin).
        if conf.get("METRICS"):
            from django_jobs import metrics

            metrics.install()
