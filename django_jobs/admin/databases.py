"""The admin with several job databases: which one a page reads, and links that keep it.

When DJANGO_JOBS["DATABASES"] names more than one alias (docs/scaling.md), every list
of job tables gets a "database" filter, ``?database=alias`` (DJANGO_JOBS["DATABASE"]
when absent): the list, its actions and the pages of its rows read and write that
database, and the links of those pages carry the parameter on. The rows of two
databases are never listed together: their ids, counts and orders are each their own.
With one job database none of this shows, and no URL changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from django_jobs import conf

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices
    from django.contrib.admin.views.main import ChangeList
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


class DatabaseChoice(AnyModelAdmin):
    """A model admin whose list, actions and row pages act on the chosen job database."""

    def get_list_filter(self, request: HttpRequest) -> Any:
        listed = list(super().get_list_filter(request))
        return [DatabaseFilter, *listed] if several() else listed

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Every view starts here: the list (before its filters), a row's page, its delete
        # and history pages, and the actions' selection.
        queryset = super().get_queryset(request)
        return queryset.using(chosen(request)) if several() else queryset

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
