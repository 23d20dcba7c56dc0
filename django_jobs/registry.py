"""Handlers: the @job decorator, retry policies, and the registry the worker looks names up in.

The worker finds handlers here by name and nowhere else: a name read from a row
is never imported, so a row naming ``os.system`` runs nothing.
"""

from __future__ import annotations

import difflib
import inspect
import os
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

from django_jobs import conf, encryption, flow, limits, uniqueness
from django_jobs.exceptions import HandlerConflict, InvalidJob, UnknownJob
from django_jobs.limits import MAX_PRIORITY, MIN_PRIORITY

# @job(chunk=N): the range of N, and how long a worker waits to fill a chunk by default.
MIN_CHUNK, MAX_CHUNK = 2, 1000
DEFAULT_CHUNK_WAIT = 1.0

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:  # TypeVar defaults (PEP 696); psycopg requires typing-extensions before 3.13
    from typing_extensions import TypeVar

if TYPE_CHECKING:
    from datetime import datetime, timedelta
    from typing import TypedDict, Unpack

    from django_jobs.context import JobContext
    from django_jobs.rows import EnqueueResult

    class EnqueueOptions(TypedDict, total=False):
        """The keyword arguments of django_jobs.enqueue."""

        key: str | None
        delay: timedelta | float | None
        run_at: datetime | None
        priority: int | None
        queue: str | None
        max_attempts: int | None
        after: Iterable[Any] | None  # job ids, EnqueueResults or keys (docs/workflows.md)
        on_parent_dead: str
        unique_for: timedelta | None
        unique_by: Iterable[str] | None

    class OnCommitOptions(EnqueueOptions, total=False):
        """The keyword arguments of django_jobs.enqueue_on_commit."""

        commit_of: str | None


# A handler's payload and return types; Any for an unannotated function (and a bare `Handler`).
P = TypeVar("P", default=Any)
R = TypeVar("R", default=Any)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before attempt n + 1 after attempt n failed.

    ``Backoff.exponential(base=2, ceiling=600)`` waits 2, 4, 8 … seconds up to
    ten minutes; ``Backoff.fixed(30)`` always 30. ``jitter`` spreads each delay
    by ± that fraction so that jobs that failed together do not retry together.
    """

    kind: Literal["fixed", "exponential"]
    base: float
    ceiling: float
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential"):
            raise ValueError(f"backoff kind must be 'fixed' or 'exponential', not {self.kind!r}")
        # The retry's run time is now() + delay: both ends must be storable dates.
        object.__setattr__(self, "base", limits.seconds("backoff base", self.base, zero=True))
        ceiling = limits.seconds("backoff ceiling", self.ceiling, zero=True)
        object.__setattr__(self, "ceiling", ceiling)
        if not self.base <= self.ceiling:
            raise ValueError("backoff needs 0 <= base <= ceiling")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter < 1
        ):
            raise ValueError(f"backoff jitter must be a number in [0, 1), not {self.jitter!r}")
        object.__setattr__(self, "jitter", float(self.jitter))

    @classmethod
    def fixed(cls, seconds: float, *, jitter: float = 0.25) -> Backoff:
        return cls("fixed", seconds, seconds, jitter)

    @classmethod
    def exponential(
        cls, base: float = 2.0, ceiling: float = 600.0, *, jitter: float = 0.25
    ) -> Backoff:
        return cls("exponential", base, ceiling, jitter)

    @classmethod
    def coerce(cls, value: object) -> Backoff:
        """Accept a Backoff, a settings dict, or a number of seconds (fixed)."""
        if isinstance(value, Backoff):
            return value
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls.fixed(value)
        raise TypeError(f"backoff must be a Backoff, a dict or seconds, not {value!r}")

    def delay(self, attempt: int) -> float:
        """Return the seconds to wait after failed attempt number `attempt` (from 1)."""
        if self.kind == "fixed":
            nominal = self.base
        else:
            nominal = min(self.ceiling, self.base * 2 ** min(attempt - 1, 62))
        spread = nominal * self.jitter
        return max(0.0, min(self.ceiling, nominal + random.uniform(-spread, spread)))  # noqa: S311


@dataclass(slots=True)
class Handler(Generic[P, R]):
    """A registered job handler and its options: what @job returns."""

    func: Callable[[P, JobContext], R]
    name: str
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None
    concurrency: int | None = None
    atomic: bool = False
    validate: Callable[[Any], object] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Flow control across the fleet (docs/flow-control.md).
    global_concurrency: int | None = None
    rate_limit: flow.Rate | None = None
    partition_by: str | flow.Partitioner | None = None
    # Tags every job of this handler carries (limits.tags), with those of each enqueue.
    tags: tuple[str, ...] = ()
    # What of the payload (and the result) is stored encrypted (encryption.Spec).
    encrypt: encryption.Spec = None
    # Unique for a period (django_jobs.uniqueness): at most one job per key and period.
    unique_for: timedelta | None = None
    unique_by: tuple[str, ...] | None = None
    # Chunk handlers (docs/handlers.md#chunk-handlers): up to `chunk` payloads per call,
    # waiting at most `chunk_wait` seconds to fill one. None: one payload per call.
    chunk: int | None = None
    chunk_wait: float = DEFAULT_CHUNK_WAIT

    def __call__(self, payload: P | None = None, ctx: JobContext | None = None) -> R:
        """Call the function directly (in tests, say), bypassing the queue."""
        # Outside a worker the function may get None for either, as it always has.
        return self.func(payload, ctx)  # type: ignore[arg-type]

    is_async: bool = field(init=False)

    if not TYPE_CHECKING:  # type checkers keep flagging unknown attributes of a Handler

        def __getattr__(self, attribute: str) -> Any:
            # Only for attributes a Handler lacks: a Celery habit gets the equivalent.
            if attribute in _CELERY_CALLS:
                raise AttributeError(
                    f"{self.name!r} is a django-jobs handler, not a Celery task: it has no "
                    f".{attribute}(); use {self.func.__name__}.enqueue_on_commit(payload, "
                    "delay=..., run_at=...) (written in your transaction; each Celery idiom and "
                    "what to write instead: docs/celery.md)"
                    f"{_CELERY_CALLS[attribute]}"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attribute!r}")

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.func)
        if self.is_async and self.atomic:
            raise ValueError(f"{self.name}: an async handler cannot be atomic=True")

    def get_queue(self) -> str:
        return self.queue or conf.get("DEFAULT_QUEUE")

    def get_max_attempts(self) -> int:
        return self.max_attempts or conf.get("MAX_ATTEMPTS")

    def get_backoff(self) -> Backoff:
        return self.backoff or Backoff.coerce(conf.get("BACKOFF"))

    def get_timeout(self) -> float | None:
        return self.timeout if self.timeout is not None else conf.get("TIMEOUT")

    def enqueue(self, payload: P | None = None, **options: Unpack[EnqueueOptions]) -> EnqueueResult:
        """Shortcut for ``django_jobs.enqueue(self, payload, **options)``."""
        return _connected().enqueue(self, payload, **options)

    def enqueue_on_commit(
        self, payload: P | None = None, **options: Unpack[OnCommitOptions]
    ) -> EnqueueResult:
        """Shortcut for ``django_jobs.enqueue_on_commit(self, payload, **options)``."""
        return _connected().enqueue_on_commit(self, payload, **options)


# What a Celery user reaches for, and what to say besides enqueue_on_commit().
_CELERY_CALLS = {
    "delay": "",
    "apply_async": "",
    "s": "; chains, groups and chords are workflows (docs/workflows.md)",
    "si": "; chains, groups and chords are workflows (docs/workflows.md)",
    "signature": "; chains, groups and chords are workflows (docs/workflows.md)",
    "map": "; or enqueue_many() for many payloads at once",
    "chunks": "; or enqueue_many() for many payloads at once",
}


@dataclass(frozen=True, slots=True)
class _EnqueueFunctions:
    enqueue: Callable[..., EnqueueResult]
    enqueue_on_commit: Callable[..., EnqueueResult]


# The enqueue API sits above the registry (it writes rows through the models), so the
# registry does not import it: the app's ready() connects it here for Handler.enqueue.
_enqueue_api: _EnqueueFunctions | None = None


def connect_enqueue(
    enqueue: Callable[..., EnqueueResult], enqueue_on_commit: Callable[..., EnqueueResult]
) -> None:
    """Make Handler.enqueue and Handler.enqueue_on_commit call these (from the app's ready())."""
    global _enqueue_api
    _enqueue_api = _EnqueueFunctions(enqueue, enqueue_on_commit)


def _connected() -> _EnqueueFunctions:
    if _enqueue_api is None:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "Handler.enqueue needs the django_jobs app loaded: add 'django_jobs' to "
            "INSTALLED_APPS, then run `python manage.py migrate`"
        )
    return _enqueue_api


_handlers: dict[str, Handler[Any, Any]] = {}
# Bumped whenever a name is added or removed, so that a worker notices new names cheaply.
_generation = 0


def _check_signature(f: Callable[..., Any]) -> None:
    """Refuse at import a function the worker cannot call as f(payload, ctx).

    Otherwise `def send(payload)` registers, and each of its jobs fails with a
    TypeError on every attempt before it reaches the dead letters.
    """
    try:
        signature = inspect.signature(f)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): the worker will tell
    try:
        signature.bind(None, None)
    except TypeError:
        title = getattr(f, "__qualname__", repr(f))
        raise InvalidJob(
            f"@job {title}{signature}: the worker calls a handler with two arguments, "
            f"the payload and the job context; declare it as def {title}(payload, ctx)"
        ) from None


def check_name(name: object) -> str:
    """Return name if it is a valid job name, else raise InvalidJob."""
    return limits.job_name(name, error=InvalidJob)


def check_queue(queue: object, *, allowlist: bool = True) -> str:
    """Return queue if it is a valid queue name (and allowed by QUEUES), else raise InvalidJob."""
    queue = limits.queue_name(queue, error=InvalidJob)
    allowed = conf.get("QUEUES") if allowlist else None
    if allowed is not None and queue not in allowed:
        raise InvalidJob(f"unknown queue {queue!r}: DJANGO_JOBS['QUEUES'] allows {sorted(allowed)}")
    return queue


def check_priority(priority: object) -> int:
    """Return priority if it is an int in -100..100, else raise InvalidJob."""
    return limits.integer("priority", priority, MIN_PRIORITY, MAX_PRIORITY, error=InvalidJob)


def check_max_attempts(value: object) -> int:
    """Return value if it is an int that fits the max_attempts column, else raise InvalidJob."""
    return limits.integer("max_attempts", value, 1, limits.MAX_INT, error=InvalidJob)


def check_timeout(value: object) -> float | None:
    """Return value as seconds (None: no timeout), else raise InvalidJob."""
    return None if value is None else limits.seconds("timeout", value, error=InvalidJob)


def check_backoff(value: object) -> Backoff | None:
    """Return value as a Backoff (None stays None), else raise InvalidJob."""
    if value is None:
        return None
    try:
        return Backoff.coerce(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"invalid backoff: {exc}") from None


def check_chunk(chunk: object, chunk_wait: object, concurrency: object) -> tuple[int | None, float]:
    """Return @job's chunk and chunk_wait if they are valid together, else raise InvalidJob."""
    if chunk is None:
        if chunk_wait is not None:
            raise InvalidJob("chunk_wait needs chunk: @job(chunk=100, chunk_wait=1.0)")
        return None, DEFAULT_CHUNK_WAIT
    size = limits.integer("chunk", chunk, MIN_CHUNK, MAX_CHUNK, error=InvalidJob)
    wait = (
        DEFAULT_CHUNK_WAIT
        if chunk_wait is None
        else limits.seconds("chunk_wait", chunk_wait, zero=True, error=InvalidJob)
    )
    if concurrency is not None:
        raise InvalidJob(
            "concurrency caps jobs, and a chunk runs many at once on one thread: "
            "@job(chunk=...) cannot take concurrency (use global_concurrency or rate_limit)"
        )
    return size, wait


def register(handler: Handler[P, R]) -> Handler[P, R]:
    """Add handler to the registry; a second function under the same name is an error."""
    existing = _handlers.get(handler.name)
    if existing is not None and _origin(existing.func) != _origin(handler.func):
        raise HandlerConflict(
            f"job name {handler.name!r} is taken by {_origin(existing.func)}; "
            f"{_origin(handler.func)} needs another name"
        )
    if existing is None:
        _bump()
    _handlers[handler.name] = handler
    return handler


def unregister(name: str) -> None:
    """Remove a handler (for tests)."""
    if _handlers.pop(name, None) is not None:
        _bump()


def _bump() -> None:
    global _generation
    _generation += 1


def generation() -> int:
    """Return a number that changes whenever a name is registered or removed."""
    return _generation


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def get_handler(name: str) -> Handler:
    """Return the handler registered under name, or raise UnknownJob."""
    try:
        return _handlers[name]
    except KeyError:
        raise UnknownJob(
            f"no job handler is registered under the name {name!r}{_hint(name)}"
        ) from None


def _hint(name: str) -> str:
    if not _handlers:
        return (
            "; no handler is registered at all: declare @job functions in a jobs.py module "
            "of an app in INSTALLED_APPS"
        )
    close = close_names(name)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def close_names(name: str) -> list[str]:
    """Return up to three registered names that name may have meant."""
    # "send_email" for "shop.jobs.send_email", then near misses ("shop.jobs.send_mail").
    close = [known for known in _handlers if known.rsplit(".", 1)[-1] == name]
    close += difflib.get_close_matches(name, [k for k in _handlers if k not in close], n=3)
    return close[:3]


def undiscovered_module(name: str) -> str | None:
    """Return the module of an installed app that a job name says declares it, if never imported.

    The default name of a handler is its module and function name: a name like
    "shop.handlers.send" whose "shop/handlers.py" exists, but is not a module
    this process imported, points at a handler declared outside the modules that
    autodiscover() imports. Only the file system is looked at: a name read from
    a row is never imported.
    """
    from django.apps import apps

    parts = name.split(".")
    for config in apps.get_app_configs():
        prefix = config.name.split(".")
        if len(parts) < len(prefix) + 2 or parts[: len(prefix)] != prefix:
            continue
        for end in range(len(parts) - 1, len(prefix), -1):  # the function may be a method
            module = ".".join(parts[:end])
            path = os.path.join(config.path, *parts[len(prefix) : end])
            if module not in sys.modules and (
                os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))
            ):
                return module
    return None


def lookup(name: str) -> Handler | None:
    """Return the handler registered under name, or None."""
    return _handlers.get(name)


def all_handlers() -> dict[str, Handler]:
    return dict(_handlers)


def declared_queues() -> set[str]:
    """Return the queues runjobs serves by default: the default one and every handler's."""
    return {conf.get("DEFAULT_QUEUE")} | {h.get_queue() for h in _handlers.values()}


@overload
def job(func: Callable[[P, JobContext], R], /) -> Handler[P, R]: ...
@overload
def job(
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    backoff: Backoff | dict[str, Any] | float | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    atomic: bool = False,
    validate: Callable[[Any], object] | None = None,
    global_concurrency: int | None = None,
    rate_limit: str | None = None,
    rate_window: str | None = None,
    partition_by: str | Callable[[Any], str] | None = None,
    tags: Iterable[str] = (),
    encrypt: bool | Iterable[str] = False,
    unique_for: timedelta | None = None,
    unique_by: Iterable[str] | None = None,
    chunk: int | None = None,
    chunk_wait: float | None = None,
) -> Callable[[Callable[[P, JobContext], R]], Handler[P, R]]: ...


def job(
    func: Callable[[P, JobContext], R] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    backoff: Backoff | dict[str, Any] | float | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    atomic: bool = False,
    validate: Callable[[Any], object] | None = None,
    global_concurrency: int | None = None,
    rate_limit: str | None = None,
    rate_window: str | None = None,
    partition_by: str | Callable[[Any], str] | None = None,
    tags: Iterable[str] = (),
    encrypt: bool | Iterable[str] = False,
    unique_for: timedelta | None = None,
    unique_by: Iterable[str] | None = None,
    chunk: int | None = None,
    chunk_wait: float | None = None,
) -> Handler[P, R] | Callable[[Callable[[P, JobContext], R]], Handler[P, R]]:
    """Declare a job handler, called as ``handler(payload, ctx)`` by the worker.

    Options: ``name`` (default: the function's dotted path), ``queue``,
    ``priority`` (-100..100, higher runs first), ``max_attempts``, ``backoff``,
    ``timeout`` (seconds), ``concurrency`` (cap per worker process), ``atomic``
    (run inside a transaction that also records completion: database effects
    happen exactly once), ``validate`` (called with the payload at enqueue and
    before running; raising ValueError/TypeError dead-letters the job).
    Across the fleet (docs/flow-control.md): ``global_concurrency`` (at most N
    running at once), ``rate_limit`` ("N/s", "N/m", "N/h": starts per window),
    ``rate_window`` ("fixed", the default, or "sliding": no interval of the
    window's length holds more than N starts),
    ``partition_by`` (a payload key or a callable: the limits hold per value).
    ``tags``: labels every job of the handler carries, to filter by (with those
    given to each enqueue). ``encrypt``: True, or some top-level keys of a dict
    payload: stored encrypted with ENCRYPTION_KEYS, decrypted in the worker only,
    the result too (docs/handlers.md#encrypted-payloads). ``unique_for`` (a
    timedelta): at most one job per period and payload, or per the payload keys
    ``unique_by`` names (docs/enqueue.md#unique-for-a-period). ``chunk`` (2..1000):
    the handler is called as ``handler(payloads, ctx)`` with up to that many
    payloads, waiting at most ``chunk_wait`` seconds (default 1.0) to fill a chunk
    (docs/handlers.md#chunk-handlers).
    """
    chunk, chunk_wait = check_chunk(chunk, chunk_wait, concurrency)
    if partition_by is not None and global_concurrency is None and rate_limit is None:
        raise InvalidJob("partition_by needs global_concurrency or rate_limit to partition")
    sealed = encryption.check_encrypt(encrypt)
    period, by = uniqueness.options(unique_for, unique_by)
    rate = (
        None
        if rate_limit is None and rate_window is None
        else flow.parse_rate(rate_limit, window=rate_window)
    )

    def decorate(f: Callable[[P, JobContext], R]) -> Handler[P, R]:
        if not callable(f):
            raise TypeError("@job decorates a function")
        _check_signature(f)
        if chunk is not None and inspect.iscoroutinefunction(f):
            raise InvalidJob(
                f"@job(chunk=...) {getattr(f, '__qualname__', f)}: a chunk handler is a plain "
                "def (async chunk handlers are not supported)"
            )
        handler = Handler(
            func=f,
            name=check_name(name if name is not None else f"{f.__module__}.{f.__qualname__}"),
            queue=check_queue(queue, allowlist=False) if queue is not None else None,
            priority=check_priority(priority),
            max_attempts=check_max_attempts(max_attempts) if max_attempts is not None else None,
            backoff=check_backoff(backoff),
            timeout=check_timeout(timeout),
            concurrency=(
                limits.integer(
                    "concurrency", concurrency, 1, limits.MAX_CONCURRENCY, error=InvalidJob
                )
                if concurrency is not None
                else None
            ),
            atomic=bool(atomic),
            validate=validate,
            global_concurrency=(
                None if global_concurrency is None else flow.check_concurrency(global_concurrency)
            ),
            rate_limit=rate,
            partition_by=None if partition_by is None else flow.check_partition_by(partition_by),
            tags=tuple(
                limits.tags(list(tags) if not isinstance(tags, str) else tags, error=InvalidJob)
            ),
            encrypt=sealed,
            unique_for=period,
            unique_by=by,
            chunk=chunk,
            chunk_wait=chunk_wait,
        )
        return register(handler)

    return decorate(func) if func is not None else decorate


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module, where handlers are declared."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
