"""The job and dead-letter lists' filters by tag and by a metadata key and value."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_jobs import registry, tagging


class _Chosen(admin.SimpleListFilter):
    """A filter whose choices cost no query: those declared in code, and the value asked.

    (Listing the tags the rows hold would read the table on every page of the list.)
    """

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        seen = self.declared()
        asked = self.value()
        if asked is not None and asked not in seen:
            seen = [*seen, asked]  # a link to any tag filters by it
        return [(value, value) for value in seen]

    def declared(self) -> list[str]:
        return []


class TagFilter(_Chosen):
    title = _("tag")
    parameter_name = "tag"

    def declared(self) -> list[str]:
        return sorted({tag for handler in registry.all_handlers().values() for tag in handler.tags})

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else tagging.tagged(queryset, [value])


class MetaFilter(_Chosen):
    """``?meta=key=value``: the rows whose meta maps key to value (linked from a job's page)."""

    title = _("metadata")
    parameter_name = "meta"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        key, _sep, wanted = value.partition("=")
        return tagging.with_meta(queryset, key, wanted)
