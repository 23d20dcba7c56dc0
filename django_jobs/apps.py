from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    label = "django_jobs"
    verbose_name = _("Jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from django_jobs import checks, checks_ops, registry, sqlite  # noqa: F401 - registers the system checks

        # SQLite as the jobs database: IMMEDIATE transactions and WAL on its connections.
        connection_created.connect(sqlite.configure, dispatch_uid="django_jobs.sqlite")
        registry.autodiscover()
        # The enqueue counter (the admin registers itself: django_jobs.admin).
        from django_jobs import conf

        if conf.get("METRICS"):
            from django_jobs import metrics

            metrics.install()
