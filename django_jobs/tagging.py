"""Filter jobs and dead letters by tag and by metadata (enqueue(tags=..., meta=...)).

One function per filter, for the admin's list filters and the commands' --tag,
whatever the engine: JSON containment (@> on PostgreSQL, along its GIN indexes
of migration 0010; JSON_CONTAINS on MariaDB) where Django has it, SQLite's
json_each and json_extract elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact


def _contains(queryset: QuerySet[Any]) -> bool:
    return bool(connections[queryset.db].features.supports_json_field_contains)


def tagged[Q: QuerySet[Any]](queryset: Q, tags: Iterable[str]) -> Q:
    """The rows of queryset that carry every tag of tags."""
    for tag in tags:
        if _contains(queryset):
            queryset = queryset.filter(tags__contains=[tag])
        else:
            table = connections[queryset.db].ops.quote_name(queryset.model._meta.db_table)
            queryset = queryset.filter(
                RawSQL(  # noqa: S611 - the tag is a parameter, the table a model's
                    f"EXISTS (SELECT 1 FROM json_each({table}.tags) AS t WHERE t.value = %s)",  # noqa: S608
                    [tag],
                    output_field=BooleanField(),
                )
            )
    return queryset


def with_meta[Q: QuerySet[Any]](queryset: Q, key: str, value: str) -> Q:
    """The rows of queryset whose meta maps key to value."""
    if _contains(queryset):
        return queryset.filter(meta__contains={key: value})
    # A plain comparison of the key's text (Exact itself, not the JSON key's own exact
    # lookup, which compares JSON values).
    return queryset.filter(Exact(KeyTextTransform(key, "meta"), value))
