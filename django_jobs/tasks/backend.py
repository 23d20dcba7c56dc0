"""A backend for Django's Tasks framework (django.tasks) that runs tasks on django-jobs.

    TASKS = {
        "default": {
            "BACKEND": "django_jobs.backend.JobsBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3, "TASKS": {"shop.tasks.charge": {"max_attempts": 8}}},
        }
    }

``Task.enqueue()`` writes a job in the caller's transaction on the jobs database,
like ``enqueue_on_commit``: it runs if and only if that transaction commits, so
it needs no ``transaction.on_commit()``. ``runjobs`` runs it with retries,
leases, completion markers and dead letters; ``get_result()`` reads it back.

Needs Django >= 6.0; importing this module on older Django raises ImportError.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import django
from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

try:
    from django.tasks import Task, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.exceptions import InvalidTask
except ModuleNotFoundError as exc:  # Django < 6.0
    if exc.name != "django.tasks":
        raise
    raise ImportError(
        "django_jobs.backend is a backend for Django's Tasks framework (django.tasks), "
        f"which Django 6.0 added; this is Django {django.get_version()}. Upgrade Django "
        "to use TASKS with django-jobs; the rest of django-jobs (@job, enqueue_on_commit, "
        "runjobs) works without it."
    ) from None


def _not_installed(alias: str | None = None) -> str:
    where = f"TASKS[{alias!r}]" if alias else "TASKS"
    return (
        f"{where} uses django_jobs.backend.JobsBackend, but 'django_jobs' is not in "
        "INSTALLED_APPS: add it (and 'rangefilter' for the admin), then run "
        "`python manage.py migrate`"
    )


if apps.ready and not apps.is_installed("django_jobs"):
    # The imports below load the models, which need the app: say what is missing instead.
    raise ImproperlyConfigured(_not_installed())

from django_jobs import conf, registry  # noqa: E402
from django_jobs.exceptions import HandlerConflict, InvalidJob, InvalidPayload  # noqa: E402
from django_jobs.registry import Backoff  # noqa: E402
from django_jobs.store import JobStore  # noqa: E402
from django_jobs.tasks import handlers, results, runner  # noqa: E402
from django_jobs.tasks.handlers import Policy, TaskHandler  # noqa: E402

if TYPE_CHECKING:
    from django_jobs.api import EnqueueResult, Workflow

_P = ParamSpec("_P")
_R = TypeVar("_R")

# OPTIONS keys: retry policy defaults of every task of the backend, and per-task overrides.
OPTION_KEYS = frozenset({"MAX_ATTEMPTS", "BACKOFF", "TIMEOUT", "TASKS"})
# Keys of a task's policy, in OPTIONS["TASKS"][module_path] and as @task(...) arguments.
POLICY_KEYS = frozenset({"max_attempts", "backoff", "timeout", "atomic"})


# Task is generic only in django-stubs: Task[...] as a base would fail at runtime.
@dataclass(frozen=True, slots=True, kw_only=True)
class JobsTask(Task):  # type: ignore[type-arg]
    """A Task with django-jobs' retry policy.

    On Django >= 6.1 the @task decorator passes its extra arguments here::

        @task(max_attempts=8, backoff=Backoff.exponential(base=5), timeout=30, atomic=True)
        def charge(order_id): ...

    On Django 6.0, set them in the backend's OPTIONS["TASKS"] instead. None means
    the OPTIONS default, then the DJANGO_JOBS default.
    """

    max_attempts: int | None = None
    backoff: Backoff | dict[str, Any] | float | None = None
    timeout: float | None = None
    atomic: bool | None = None

    def __post_init__(self) -> None:
        if self.backoff is not None and not isinstance(self.backoff, Backoff):
            # A Backoff is frozen, so the Task stays hashable.
            try:
                object.__setattr__(self, "backoff", Backoff.coerce(self.backoff))
            except (TypeError, ValueError) as exc:
                raise InvalidTask(f"invalid backoff for {self.module_path}: {exc}") from exc
        # Not super(): slots=True makes a new class that the zero-argument form does not know.
        Task.__post_init__(self)


class JobsBackend(BaseTaskBackend):
    """Run django.tasks Tasks on django-jobs' worker (``manage.py runjobs``)."""

    task_class = JobsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    # OPTIONS are not validated at construction: check() reports them, and
    # validate_task() refuses the tasks whose policy they would break.

    # ---- declaring ----------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """Refuse a Task this backend cannot run; register it for the worker.

        Django calls this when a Task is declared (@task), varied (.using()) and
        enqueued, so every task of this backend is in the registry that the
        worker looks job names up in, and nothing else is.
        """
        if not apps.is_installed("django_jobs"):
            # Without the app no check of ours runs (E101 needs django.tasks imported before
            # `check` starts), and the first enqueue would fail on a missing table: say why now.
            raise ImproperlyConfigured(_not_installed(self.alias))
        self._declare(task)

    def _declare(self, task: Task[..., Any]) -> TaskHandler:
        super().validate_task(task)
        try:
            registry.check_name(task.module_path)
            registry.check_queue(task.queue_name)
        except InvalidJob as exc:
            raise InvalidTask(str(exc)) from exc
        policy = self.policy(task)
        if policy.atomic and iscoroutinefunction(task.func):
            raise InvalidTask(f"{task.module_path}: atomic=True needs a sync function, not async")
        try:
            return handlers.register(task, policy)
        except HandlerConflict as exc:
            raise InvalidTask(str(exc)) from exc

    def policy(self, task: Task[..., Any]) -> Policy:
        """Return task's retry policy: @task arguments, then OPTIONS["TASKS"], then OPTIONS."""
        options = self.options if isinstance(self.options, dict) else {}
        per_task = options.get("TASKS") or {}
        mapped = per_task.get(task.module_path, {}) if isinstance(per_task, dict) else {}
        if not isinstance(mapped, dict):
            raise InvalidTask(f'OPTIONS["TASKS"][{task.module_path!r}] must be a dict')

        def pick(key: str) -> Any:
            value = getattr(task, key, None)
            if value is None:
                value = mapped.get(key)
            if value is None and key != "atomic":
                value = options.get(key.upper())
            return value

        try:
            return Policy(
                max_attempts=_max_attempts(pick("max_attempts")),
                backoff=Backoff.coerce(pick("backoff")) if pick("backoff") is not None else None,
                timeout=registry.check_timeout(pick("timeout")),
                atomic=bool(pick("atomic")),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"invalid retry policy for {task.module_path}: {exc}") from exc

    # ---- enqueueing ---------------------------------------------------------

    def enqueue(
        self, task: Task[_P, _R], args: Iterable[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[_P, _R]:
        """Write the task's job in the current transaction on the jobs database.

        The job exists if and only if that transaction commits (at once when none
        is open), so wrapping this in transaction.on_commit() is not needed.
        Raises InvalidTask for an invalid task or queue and InvalidTaskArguments (a
        TypeError and a ValueError) for arguments that are not JSON; nothing is
        written then.
        """
        from django_jobs.api import enqueue_on_commit

        handler = self._declare(task)
        payload = handlers.payload(args, kwargs)
        with _as_task_errors():
            job = enqueue_on_commit(handler, payload, **_job_options(task))
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.READY,
            # The time in the row, so that the result equals get_result()'s.
            enqueued_at=job.enqueued_at or timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # Like job_enqueued: a task is enqueued when its transaction commits, not before.
        transaction.on_commit(partial(runner.send_enqueued, task, result), using=job.database)
        return result

    # ---- results ------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """Return the TaskResult of a task's job id, from any process.

        Raises TaskResultDoesNotExist for an id that is not a task's job.
        """
        return results.lookup(result_id)

    # ---- checks -------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """Report misconfiguration as system-check messages (django_jobs.E101...)."""
        errors: list[CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("django_jobs"):
            message, hint = _not_installed(self.alias).split(": ", 1)
            errors.append(Error(message + ".", hint=hint, id="django_jobs.E101"))
        errors += self._check_options(where)
        errors += self._check_queues(where)
        alias = conf.database()
        if alias in connections:
            connection = connections[alias]
            if not JobStore(alias).claims_safely():
                errors.append(
                    Error(
                        f"{where}: the jobs database {alias!r} ({connection.display_name}) "
                        "does not support SELECT ... FOR UPDATE SKIP LOCKED, "
                        "which workers claim tasks with.",
                        hint="Keep the jobs on PostgreSQL (or SQLite on a single machine): "
                        "set DJANGO_JOBS['DATABASE'].",
                        id="django_jobs.E106",
                    )
                )
        return errors

    def _check_options(self, where: str) -> list[CheckMessage]:
        # OPTIONS is whatever the settings hold, whatever BaseTaskBackend's type says.
        options: object = self.options
        if not isinstance(options, dict):
            return [Error(f"{where}['OPTIONS'] must be a dict.", id="django_jobs.E102")]
        errors: list[CheckMessage] = []
        unknown = sorted(set(options) - OPTION_KEYS)
        if unknown:
            errors.append(
                Error(
                    f"{where}['OPTIONS'] has unknown keys: {', '.join(map(str, unknown))}.",
                    hint=f"Known keys: {', '.join(sorted(OPTION_KEYS))}.",
                    id="django_jobs.E102",
                )
            )
        for key, check in (
            ("MAX_ATTEMPTS", _max_attempts),
            ("BACKOFF", registry.check_backoff),
            ("TIMEOUT", registry.check_timeout),
        ):
            try:
                check(options.get(key))
            except (TypeError, ValueError) as exc:
                errors.append(
                    Error(f"{where}['OPTIONS']['{key}'] is invalid: {exc}", id="django_jobs.E103")
                )
        per_task = options.get("TASKS", {})
        if not isinstance(per_task, dict):
            return [
                *errors,
                Error(f"{where}['OPTIONS']['TASKS'] must be a dict.", id="django_jobs.E104"),
            ]
        for path, policy in per_task.items():
            problem = _policy_problem(policy)
            if problem:
                errors.append(
                    Error(
                        f"{where}['OPTIONS']['TASKS'][{path!r}] {problem}",
                        hint=f"Map task module paths to dicts of {', '.join(sorted(POLICY_KEYS))}.",
                        id="django_jobs.E104",
                    )
                )
        return errors

    def _check_queues(self, where: str) -> list[CheckMessage]:
        errors: list[CheckMessage] = []
        allowed = conf.get("QUEUES")
        for queue in sorted(self.queues, key=str):
            try:
                registry.check_queue(queue, allowlist=False)
            except InvalidJob as exc:
                errors.append(Error(f"{where}['QUEUES']: {exc}", id="django_jobs.E105"))
                continue
            if isinstance(allowed, list | tuple | set | frozenset) and queue not in allowed:
                errors.append(
                    Error(
                        f"{where}['QUEUES'] names {queue!r}, "
                        "which DJANGO_JOBS['QUEUES'] does not allow.",
                        hint="Add it to DJANGO_JOBS['QUEUES'], or leave that setting None.",
                        id="django_jobs.E105",
                    )
                )
        return errors


def enqueue_step(
    steps: Workflow,
    task: Task[..., Any],
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    after: Iterable[Any] = (),
    on_parent_dead: str = "wait",
) -> EnqueueResult:
    """Add a call of task to a ``workflow()`` block: the job Task.enqueue writes, with `after`.

    django.tasks has no dependencies: its ``enqueue(*args, **kwargs)`` hands every
    argument to the function. So a task joins a workflow through this, with its
    arguments as a list and a dict. The step's job is the task's (its module path,
    ``{"args": ..., "kwargs": ...}``, its queue, priority and run_after), and
    ``task.get_result(str(result.id))`` reads it back. Raises InvalidTask for a task
    of another backend, InvalidTaskArguments for arguments that are not JSON.
    """
    backend = task.get_backend()
    if not isinstance(backend, JobsBackend):
        raise InvalidTask(
            f"{task.module_path} runs on {type(backend).__name__}: only a task of a "
            "JobsBackend can be a step of a django-jobs workflow"
        )
    handler = backend._declare(task)
    payload = handlers.payload(args, kwargs or {})
    with _as_task_errors():
        return steps.enqueue(
            handler, payload, after=after, on_parent_dead=on_parent_dead, **_job_options(task)
        )


def _job_options(task: Task[..., Any]) -> dict[str, Any]:
    """The options of a task's job: its priority, queue and run time."""
    return {"priority": task.priority, "queue": task.queue_name, "run_at": task.run_after}


@contextmanager
def _as_task_errors() -> Iterator[None]:
    """Raise an enqueue's InvalidJob as django.tasks' InvalidTask (InvalidPayload as is)."""
    try:
        yield
    except InvalidPayload:
        raise
    except InvalidJob as exc:
        raise InvalidTask(str(exc)) from exc


def _max_attempts(value: Any) -> int | None:
    return None if value is None else registry.check_max_attempts(value)


def _policy_problem(policy: Any) -> str | None:
    if not isinstance(policy, dict):
        return "must be a dict."
    unknown = sorted(set(policy) - POLICY_KEYS)
    if unknown:
        return f"has unknown keys: {', '.join(map(str, unknown))}."
    try:
        _max_attempts(policy.get("max_attempts"))
        registry.check_backoff(policy.get("backoff"))
        registry.check_timeout(policy.get("timeout"))
    except (TypeError, ValueError) as exc:
        return f"is invalid: {exc}"
    if not isinstance(policy.get("atomic", False), bool):
        return "is invalid: atomic must be True or False."
    return None


def configured_aliases() -> list[str]:
    """Return the TASKS aliases whose backend is a JobsBackend."""
    from django.tasks import task_backends

    aliases = []
    for alias, params in task_backends.settings.items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django reports a bad BACKEND when the backend is used
        if isinstance(backend, type) and issubclass(backend, JobsBackend):
            aliases.append(alias)
    return aliases
