from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    label = "django_jobs"
    verbose_name = _("Jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_jobs import checks, registry  # noqa: F401 - registers the system checks

        registry.autodiscover()
