"""The jobs admin's base classes: read-only, guarded against hostile input, counted cheaply."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.contrib.admin import ShowFacets
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.models import LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import DataError
from django.db.models import JSONField, Model, Q, QuerySet, TextField
from django.db.models.functions import Cast, Length
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import limits
from django_jobs.admin.databases import DatabaseChangeList, DatabaseChoice
from django_jobs.admin.display import Unreadable, cell
from django_jobs.models import CompletionMarker, Job
from django_jobs.store import JobStore

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldGroups

    # django-stubs makes these generic in their model; Django's classes take no [...].
    AnyModelAdmin = admin.ModelAdmin[Any]
    _Paginator = Paginator[Any]
else:
    AnyModelAdmin = admin.ModelAdmin
    _Paginator = Paginator

# Where Django logs the lookups its admin refuses: security monitoring reads it.
security_logger = logging.getLogger("django.security.DisallowedModelAdminLookup")

# Rows counted exactly before the change lists switch to the planner's estimate.
EXACT_COUNT_LIMIT = 10_000


class EstimatedCountPaginator(_Paginator):
    """Count exactly up to EXACT_COUNT_LIMIT rows, then ask PostgreSQL's planner.

    An exact ``COUNT(*)`` reads every matching row: on a million completion
    markers that is the slowest query of the page. Counting at most a limit
    reads a bounded slice along the list's index; past it, "about N" is enough
    to page through.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        exact = queryset[: EXACT_COUNT_LIMIT + 1].count()
        if exact <= EXACT_COUNT_LIMIT:
            return exact
        if not JobStore(queryset.db).estimates_counts:
            return queryset.count()  # SQLite counts fast, and has no estimate to offer
        self.estimated = True
        try:
            plan = json.loads(queryset.explain(format="json"))
            estimate = int(plan[0]["Plan"]["Plan Rows"])
        except (ValueError, KeyError, IndexError, TypeError):
            estimate = 0
        return max(exact, estimate)


def log_changes(
    request: HttpRequest, model: type[Model], entries: Iterable[tuple[Any, str, str]], flag: int
) -> None:
    """Write one LogEntry per (pk, repr, message), in one INSERT."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=cast(int, request.user.pk),  # admin views run for a signed-in user
                content_type_id=content_type.pk,
                object_id=str(pk),
                object_repr=text[:200],
                action_flag=flag,
                change_message=message,
            )
            for pk, text, message in entries
        ]
    )


def parse_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None


class UndeclaredFilter(DisallowedModelAdminLookup):
    """A query-string parameter that is none of the list's declared filters."""

    def __init__(self, parameters: list[str]) -> None:
        # Each key as a short repr: a query string may hold line breaks, or megabytes.
        self.shown = ", ".join(limits.shown(key, 80) for key in parameters[:5])
        super().__init__(f"Filtering by {self.shown} not allowed")


class DeclaredFiltersChangeList(DatabaseChangeList):
    """A change list that filters by its declared filters only, never by any lookup asked.

    Django's admin applies every query-string parameter that no list filter takes as a
    lookup (``?payload__contains=...``): on a masked payload or result, the row count
    answers yes or no about the secret, and on a text column each such filter reads the
    whole table. Here, what the list filters, the date hierarchy and (as an exact match)
    a filtered field's own name do not take is refused before any query runs on it.
    """

    def get_filters(self, request: HttpRequest) -> Any:
        asked = self.get_filters_params()  # the query string without Django's own p, o, q ...
        filters = super().get_filters(request)
        left = filters[2]  # what the list filters and the date hierarchy did not take
        exact = set(field_filters(self.model_admin.get_list_filter(request)))
        undeclared = sorted(key for key in asked if key in left and key not in exact)
        if undeclared:
            raise UndeclaredFilter(undeclared)
        return filters


def field_filters(list_filter: Any) -> list[str]:
    """The field paths of a list_filter's field filters (not its SimpleListFilters)."""
    paths = []
    for item in list_filter:
        field = item[0] if isinstance(item, list | tuple) else item
        if isinstance(field, str):
            paths.append(field)
    return paths


class GuardedAdmin(DatabaseChoice):
    """Answer hostile query strings and object ids with a 400 or Django's "?e=1", never a 500.

    The lists filter only by their declared filters (see DeclaredFiltersChangeList), show
    no facet counts (one COUNT per filter choice, each over the whole table), and a POST
    of an action the user is not offered answers 403. With several job databases, each
    list and page acts on the one chosen (admin/databases.py).
    """

    show_facets = ShowFacets.NEVER

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DeclaredFiltersChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if any("\x00" in text for key, values in request.GET.lists() for text in (key, *values)):
            # PostgreSQL refuses NUL in any text it is sent: no row can match it anyway.
            return HttpResponseBadRequest(
                _("A NUL character is not allowed in a filter or a search.")
            )
        if request.method == "POST":
            offered = self.get_actions(request)
            # Django answers an action it does not offer with the list (200) or "No action
            # selected": a forged POST should say that it was refused.
            if any(name and name not in offered for name in request.POST.getlist("action")):
                raise PermissionDenied
        # Dashboard link on every change list of ours (the template shows it).
        extra = {"django_jobs_dashboard_url": dashboard_url(self), **(extra_context or {})}
        try:
            response = super().changelist_view(request, extra_context=extra)
            if self.date_hierarchy and isinstance(response, TemplateResponse):
                try:
                    response.render()
                except (OverflowError, ValueError):
                    # Django's date links take the list's first and last times to local
                    # time: a time written by hand near year 1 or 9999 has none here
                    # (OverflowError; MySQL's CONVERT_TZ gives NULL: ValueError).
                    request.django_jobs_no_date_links = True  # type: ignore[attr-defined]
                    response = super().changelist_view(request, extra_context=extra)
            return response
        except UndeclaredFilter as exc:
            security_logger.error("%s", exc)  # as Django logs the lookups it refuses
            message = _(
                "This list does not filter by %(parameters)s: use the filters it offers, "
                "or the search box."
            ) % {"parameters": exc.shown}
            return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            changelist = super().get_changelist_instance(request)
        except (ValueError, OverflowError, DataError) as exc:
            # Django's own filters raise these on values past the limits of their types
            # (?dead_at__year=9999 asks for the year 10000): answer as Django does for an
            # unknown filter, by a redirect to the unfiltered list with ?e=1.
            raise IncorrectLookupParameters(exc) from exc
        if getattr(request, "django_jobs_no_date_links", False):
            changelist.date_hierarchy = None
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None  # no row has it, and PostgreSQL refuses it in a query
        try:
            return super().get_object(request, object_id, from_field)
        except RecursionError:
            # A JSON column nested past what json decodes (jsonb holds thousands of
            # levels; only a hand edit writes them): the row without it, and no 500.
            return _without_unreadable_json(self.get_queryset(request), object_id, from_field)


def _without_unreadable_json(queryset: QuerySet[Any], object_id: str, from_field: Any) -> Any:
    """The row, each JSON column json cannot decode replaced by an Unreadable (its size)."""
    meta = queryset.model._meta
    field = meta.pk if from_field is None else meta.get_field(from_field)
    row = queryset.filter(**{field.name: field.to_python(object_id)})
    columns = [f.name for f in meta.concrete_fields if isinstance(f, JSONField)]
    sizes = {f"_{name}_size": Length(Cast(name, TextField())) for name in columns}
    obj = row.defer(*columns).annotate(**sizes).first()
    for name in columns if obj is not None else ():
        try:
            value = row.values_list(name, flat=True).first()
        except RecursionError:
            value = Unreadable(getattr(obj, f"_{name}_size"))
        setattr(obj, name, value)
    return obj


def dashboard_url(model_admin: admin.ModelAdmin[Any]) -> str | None:
    try:
        return reverse(f"{model_admin.admin_site.name}:django_jobs_dashboard")
    except NoReverseMatch:  # a site without the jobs admin (and so without its dashboard)
        return None


class ReadOnlyAdmin(GuardedAdmin):
    """No add, no edit: rows change only through the explicit actions."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False  # a second, unfiltered COUNT(*) of the whole table
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    list_deferred: list[str] = []

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        url_name = match.url_name if match is not None else None
        if self.list_deferred and url_name is not None and url_name.endswith("_changelist"):
            queryset = queryset.defer(*self.list_deferred)
        return queryset

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # django-admin-rangefilter puts request.csp_nonce (django-csp's name) on its inline
        # style and script; Django's own CSP middleware keeps the nonce as _csp_nonce.
        # Hand it over, or a strict Content-Security-Policy blocks the date-range filters.
        nonce = getattr(request, "_csp_nonce", None)
        if nonce is not None and not hasattr(request, "csp_nonce"):
            request.csp_nonce = nonce  # type: ignore[attr-defined]  # django-csp's attribute
        return super().changelist_view(request, extra_context=extra_context)


class NameQueueColumns:
    """The name and queue columns of the job-like lists, cut to fit at 1280 px."""

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: Job | CompletionMarker) -> SafeString | str:
        return cell(obj.name, 64, name=True)

    @admin.display(description=_("queue"), ordering="queue")
    def queue_cell(self, obj: Job | CompletionMarker) -> SafeString | str:
        return cell(obj.queue, 32, name=True)


class IdOrTermSearch:
    """Search by a job id or by a term, each matched as the list says (ids and keys exactly)."""

    def search_id(self, job_id: uuid.UUID, term: str) -> Q:
        return Q(id=job_id)

    def search_term(self, term: str) -> Q:
        return Q(key=term)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = parse_uuid(term)
        if job_id is not None:
            return queryset.filter(self.search_id(job_id, term)), False
        return queryset.filter(self.search_term(term)), False


class OperationsAdmin(GuardedAdmin):
    """No adding, no deleting, no editing: the actions are the only writes."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Actions need the change permission on the list; detail pages stay read-only.
        return obj is None and super().has_change_permission(request, obj)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> _FieldGroups:
        # Only the listed fields: the model's own JSON fields would bypass the bounded displays.
        return list(self.get_readonly_fields(request, obj))
