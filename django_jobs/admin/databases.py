"""The admin with several job databases: which one a page reads, and links that keep it.

When DJANGO_JOBS["DATABASES"] names more than one alias (docs/scaling.md), every list
of job tables gets a "database" filter, ``?database=alias`` (DJANGO_JOBS["DATABASE"]
when absent): the list, its actions and the pages of its rows read and write that
database, and the links of those pages carry the parameter on. The rows of two
databases are never listed together: their ids, counts and orders are each their own.
With one job database none of this shows, and no URL changes.

A job database that cannot be read (its server down, its tables not migrated) does not
take the admin down with it: the dashboard's section of it says so, and its list
and the pages of its rows answer with Django's app page and an error message rather
than a 500.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.views.main import ChangeList
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from django_jobs import conf

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices
    from django.db.models.options import Options
    from django_stubs_ext import StrOrPromise

    AnyModelAdmin = admin.ModelAdmin[Any]
else:
    AnyModelAdmin = admin.ModelAdmin

PARAMETER = "database"
# Where Django's admin keeps a list's query string on the pages of its rows.
PRESERVED = "_changelist_filters"


def several() -> bool:
    """Whether the jobs live in more than one database (the filter and sections show)."""
    return len(conf.databases()) > 1


def chosen(request: HttpRequest) -> str:
    """The job database a request asks for (``?database=``, or its list's), else the default.

    A row's page is reached from its list with the list's query string in
    ``_changelist_filters``: the database is read from there too. An alias that is no
    job database is the default's: the list refuses it (DatabaseFilter), a page 404s.
    """
    asked = request.GET.get(PARAMETER)
    if asked is None and (kept := request.GET.get(PRESERVED)):
        asked = QueryDict(kept).get(PARAMETER)
    return asked if asked in conf.databases() else conf.database()


def keep(url: str, alias: str | None) -> str:
    """url with ``database=alias`` added, unless alias is the default database (or None)."""
    if alias is None or alias == conf.database():
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode({PARAMETER: alias})}"


def could_not_read(alias: str, exc: DatabaseError) -> str:
    """What a page says of job database alias when reading it raised exc: its first line.

    The first line names the cause (connection refused, no such table) without the
    driver's hints below it; a message past 300 characters is cut.
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if len(first) > 300:
        first = f"{first[:299]}…"
    return str(_("could not read database %(alias)s: %(error)s")) % {
        "alias": repr(alias),
        "error": first,
    }


class DatabaseFilter(admin.SimpleListFilter):
    """Which job database the list shows: one of them, the default unless chosen (no "All")."""

    title = _("database")
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        return [(alias, alias) for alias in conf.databases()]

    def has_output(self) -> bool:
        return several()

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        current = self.value() or conf.database()
        for alias, label in self.lookup_choices:
            yield {
                "selected": alias == current,
                "query_string": changelist.get_query_string({PARAMETER: alias}),
                "display": label,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value not in conf.databases():
            # As Django answers a filter value it does not know: the list, with ?e=1.
            raise IncorrectLookupParameters(f"{value[:80]!r} is not a job database")
        return queryset.using(value)


class DatabaseChangeList(ChangeList):
    """A list whose "Clear all filters" link clears the filters, not the database chosen.

    The database is the list's subject more than a filter of it (it has no "All"): the
    link leads to every row of the same database, and shows only when another filter is on.
    """

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        if several() and PARAMETER in self.params:
            others = [key for key in self.get_filters_params() if key != PARAMETER]
            self.clear_all_filters_qs = self.get_query_string(remove=others)
            self.has_active_filters = bool(others)
        return queryset


class DatabaseChoice(AnyModelAdmin):
    """A model admin whose list, actions and row pages act on the chosen job database."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DatabaseChangeList

    def get_list_filter(self, request: HttpRequest) -> Any:
        listed = list(super().get_list_filter(request))
        return [DatabaseFilter, *listed] if several() else listed

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Every view starts here: the list (before its filters), a row's page, its delete
        # and history pages, and the actions' selection.
        queryset = super().get_queryset(request)
        return queryset.using(chosen(request)) if several() else queryset

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        view = super().changelist_view
        return self._unless_away(request, lambda: view(request, extra_context))

    def _unless_away(self, request: HttpRequest, view: Callable[[], HttpResponse]) -> HttpResponse:
        """view's response; if its job database cannot be read, the app's page saying so.

        One database away must not read as the admin broken: the app's page (it reads
        no job table) with what went wrong, the other databases a click away. With one
        job database there is nothing else to show: the error is Django's, as before.
        """
        try:
            return view()
        except DatabaseError as exc:
            if not several():
                raise
            messages.error(request, could_not_read(chosen(request), exc))
            app = reverse(
                f"{self.admin_site.name}:app_list", kwargs={"app_label": self.opts.app_label}
            )
            return HttpResponseRedirect(app)

    def _row_links(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        """The links of a row's pages back to its list and its page, in its database.

        Django's breadcrumbs link the list with no query string: to the default database's.
        Here they keep the row's database (and only that, as Django keeps no filter);
        with several databases the change page also says which one the row lives in.
        """
        if not several():
            return {}
        alias = chosen(request)
        site, opts = self.admin_site.name, self.opts
        base = f"{site}:{opts.app_label}_{opts.model_name}"
        return {
            "django_jobs_database": alias,
            "django_jobs_list_url": keep(reverse(f"{base}_changelist"), alias),
            # object_id as the URL spelled it: already quoted.
            "django_jobs_change_url": keep(reverse(f"{base}_change", args=[object_id]), alias),
        }

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        view = super().change_view
        return self._row_page(
            request,
            object_id,
            extra_context,
            lambda extra: view(request, object_id, form_url, extra),
        )

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        view = super().delete_view
        return self._row_page(
            request, object_id, extra_context, lambda extra: view(request, object_id, extra)
        )

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        view = super().history_view
        return self._row_page(
            request, object_id, extra_context, lambda extra: view(request, object_id, extra)
        )

    def _row_page(
        self,
        request: HttpRequest,
        object_id: str,
        extra_context: dict[str, Any] | None,
        view: Callable[[dict[str, Any]], HttpResponse],
    ) -> HttpResponse:
        """A row's page (view, given its extra context) with its links; its database away: see
        _unless_away."""
        extra = {**self._row_links(request, object_id), **(extra_context or {})}
        return self._unless_away(request, lambda: view(extra))

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        # Django goes back to the list only for a user who may change rows, else to the
        # site's index: a read-only list (the dead letters) is left for the index, and
        # with it the database the row was in. Whoever may view the list goes back to it.
        response = super().response_delete(request, obj_display, obj_id)
        index = reverse("admin:index", current_app=self.admin_site.name)
        redirected = isinstance(response, HttpResponseRedirect)
        if not redirected or response["Location"] != index or not self.has_view_permission(request):
            return response
        opts = self.opts
        changelist = reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
        )
        context: dict[str, Options[Any] | str] = {
            "preserved_filters": self.get_preserved_filters(request),
            "opts": opts,
        }
        return HttpResponseRedirect(add_preserved_filters(context, changelist))

    def get_preserved_filters(self, request: HttpRequest) -> str:
        # A row's page opened by a link that says ?database= (not from its list): its
        # breadcrumbs, delete link and redirects go back to that database's list.
        preserved = super().get_preserved_filters(request)
        asked = request.GET.get(PARAMETER)
        if preserved or not several() or asked is None or asked == conf.database():
            return preserved
        if asked not in conf.databases():
            return preserved
        return urlencode({PRESERVED: urlencode({PARAMETER: asked})})
