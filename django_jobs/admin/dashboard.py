"""The jobs dashboard page: queues, the last hour's completions and dead letters, at a glance.

With several job databases, a section per database (each its own figures and workers),
its links to the lists saying which database; a database that cannot be read (down, not
migrated) gets a section that says so, and the others show as usual.

The figures and the chart come from django_jobs.dashboard; this is its admin view, mounted
under the jobs list (``admin:django_jobs_dashboard``) and linked from the site's index.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.text import slugify
from django.utils.translation import gettext_lazy as _

from django_jobs import conf, dashboard
from django_jobs.admin.base import AnyModelAdmin
from django_jobs.admin.databases import PARAMETER, could_not_read, keep, several


class DashboardView(AnyModelAdmin):
    """Mount the dashboard under the jobs list's URLs."""

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", view, name="django_jobs_dashboard"), *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The queue dashboard, for staff with any django_jobs permission (as the metrics)."""
        if not dashboard.may_see(request.user):
            raise PermissionDenied
        site = self.admin_site.name
        context = {
            **self.admin_site.each_context(request),
            "title": _("Jobs dashboard"),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            # One section per job database, DJANGO_JOBS["DATABASE"] first: with one, the
            # page is that section without a heading.
            "sections": [self._section(alias) for alias in conf.databases()],
            "deadletter_url": reverse(f"{site}:django_jobs_deadletter_changelist"),
            "job_url": reverse(f"{site}:django_jobs_job_changelist"),
        }
        return TemplateResponse(request, "admin/django_jobs/dashboard.html", context)

    def _section(self, alias: str) -> dict[str, Any]:
        """The figures and charts of job database alias, and what its links add to a URL.

        With several job databases, one that cannot be read gives a section with the
        error's first line alone: the others' figures are what an operator needs then.
        """
        default = alias == conf.database()
        frame = {
            "alias": alias,
            "heading": several(),
            # The default's element ids are the page's of one database: others' say theirs.
            "suffix": "" if default else f"-{slugify(alias)}",
        }
        try:
            snap = dashboard.snapshot(alias)
        except DatabaseError as exc:
            if not several():
                raise
            return {**frame, "error": could_not_read(alias, exc)}
        workers = reverse(f"{self.admin_site.name}:django_jobs_workerbeat_changelist")
        return {
            **frame,
            "query": "" if default else f"{urlencode({PARAMETER: alias})}&",  # then more
            "change_query": keep("", alias),  # alone, after a row's URL
            "snap": snap,
            "queues": [(row, dashboard.duration(row.oldest_age)) for row in snap.queues],
            "completed_chart": dashboard.bar_chart(
                snap.completed,
                start=snap.start,
                title=str(_("Completions per minute")),
                unit=str(_("completed")),
                color="#417690",
            ),
            "dead_chart": dashboard.bar_chart(
                snap.dead,
                start=snap.start,
                title=str(_("Dead letters per minute")),
                unit=str(_("dead-lettered")),
                color="#ba2121",
            ),
            "worker_url": keep(workers, alias),
        }


# The site's index links the jobs dashboard (unless the project has an index template of its own).
if admin.site.index_template is None:
    admin.site.index_template = "admin/django_jobs/index.html"
