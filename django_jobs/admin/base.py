"""The jobs admin's base classes: read-only, guarded against hostile input, counted cheaply."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Paginator
from django.db import DataError, connections
from django.db.models import JSONField, Model, Q, QuerySet, TextField
from django.db.models.functions import Cast, Length
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import NoReverseMatch, reverse
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs.admin.display import Unreadable, cell
from django_jobs.models import CompletionMarker, Job

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldGroups

    # django-stubs makes these generic in their model; Django's classes take no [...].
    AnyModelAdmin = admin.ModelAdmin[Any]
    _Paginator = Paginator[Any]
else:
    AnyModelAdmin = admin.ModelAdmin
    _Paginator = Paginator

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
        if connections[queryset.db].vendor != "postgresql":
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


class GuardedAdmin(AnyModelAdmin):
    """Answer hostile query strings and object ids with a 400 or Django's "?e=1", never a 500."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if any("\x00" in text for key, values in request.GET.lists() for text in (key, *values)):
            # PostgreSQL refuses NUL in any text it is sent: no row can match it anyway.
            return HttpResponseBadRequest(
                _("A NUL character is not allowed in a filter or a search.")
            )
        # Dashboard link on every change list of ours (the template shows it).
        extra = {"django_jobs_dashboard_url": dashboard_url(self), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)
        except (ValueError, OverflowError, DataError) as exc:
            # Django's own filters raise these on values past the limits of their types
            # (?dead_at__year=9999 asks for the year 10000): answer as Django does for an
            # unknown filter, by a redirect to the unfiltered list with ?e=1.
            raise IncorrectLookupParameters(exc) from exc

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
