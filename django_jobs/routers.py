"""Which database holds a job: Django's router for the tables, and enqueue's choice of alias.

    DATABASE_ROUTERS = ["django_jobs.routers.JobsRouter"]

Reads and writes already go to DJANGO_JOBS["DATABASE"] through the models' managers;
the router is what makes ``migrate`` create the tables on the job databases (DATABASE
and every alias of DATABASES) and nowhere else, and what keeps a row loaded from one
of them saved back there.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import Model

from django_jobs import conf, limits
from django_jobs.exceptions import InvalidJob

APP_LABEL = "django_jobs"


class JobsRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return _of(model, hints)

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return _of(model, hints)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == APP_LABEL:
            return db in conf.databases()
        return None


def _of(model: type[Model], hints: dict[str, Any]) -> str | None:
    if model._meta.app_label != APP_LABEL:
        return None
    instance = hints.get("instance")
    held = getattr(getattr(instance, "_state", None), "db", None)
    return held if held in conf.databases() else conf.database()


def job_database(using: str | None, name: str, queue: str, payload: Any) -> str:
    """Return the alias a job is written on (docs/scaling.md#several-databases).

    `using` when given; else the job database of the caller's innermost open
    ``atomic`` block, so that the job commits with the rows it belongs to; else
    DJANGO_JOBS["ROUTE"]'s answer; else DJANGO_JOBS["DATABASE"].
    """
    aliases = conf.databases()
    if using is not None:
        if type(using) is not str or using not in aliases:
            raise InvalidJob(
                f"using={limits.shown(using, 100)} is not a job database: "
                f"DJANGO_JOBS['DATABASES'] holds {', '.join(map(repr, aliases))}"
            )
        return using
    route = conf.route()
    if len(aliases) == 1 and route is None:
        return aliases[0]
    routed = _routed(route, name, queue, payload, aliases) if route is not None else None
    if len(aliases) > 1 and (held := _innermost(aliases, routed)) is not None:
        return held
    return routed or conf.database()


def _routed(route: Any, name: str, queue: str, payload: Any, aliases: tuple[str, ...]) -> Any:
    alias = route(name, queue, payload)
    if alias is not None and (type(alias) is not str or alias not in aliases):
        raise InvalidJob(
            f"DJANGO_JOBS['ROUTE'] returned {limits.shown(alias, 100)} for job {name!r}, which is "
            f"not a job database: DJANGO_JOBS['DATABASES'] holds {', '.join(map(repr, aliases))}"
        )
    return alias


def _innermost(aliases: tuple[str, ...], routed: str | None) -> str | None:
    """The job database whose open atomic block is the innermost (None: no block open).

    Django does not record in what order blocks on different aliases were opened, so
    the innermost is the one nested deepest. Between equally deep ones, a block on
    another job database wins over one on DATABASE (which ATOMIC_REQUESTS opens around
    the whole view); between others, the route's alias; else the call is ambiguous.
    """
    open_ = {
        conn.alias: len(conn.atomic_blocks)
        for conn in connections.all(initialized_only=True)
        if conn.alias in aliases and conn.in_atomic_block
    }
    if not open_:
        return None
    deepest = max(open_.values())
    tied = [alias for alias in aliases if open_.get(alias) == deepest]
    if len(tied) > 1 and (default := conf.database()) in tied:
        tied.remove(default)
    if len(tied) == 1:
        return tied[0]
    if routed in tied:
        return routed
    raise InvalidJob(
        f"transactions are open on the job databases {', '.join(map(repr, tied))}, equally "
        "nested: pass using= to say which one the job commits with"
    )
