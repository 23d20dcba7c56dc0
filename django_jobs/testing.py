"""Run and inspect jobs in your own tests, through the worker's real code paths.

    from django_jobs import testing

    def test_signup_sends_the_welcome_mail(client):
        client.post("/signup/", {"email": "ada@example.com"})
        testing.assert_enqueued(send_welcome, {"email": "ada@example.com"})
        summary = testing.drain()
        assert len(summary.succeeded) == 1

``drain()`` runs due jobs in the calling thread, on the test's own database
connection: the worker's claim, its settle (batched completion, atomic
completion, retry with backoff, dead letters) and its skip of completed keys,
not a stand-in. It therefore works inside a ``TestCase``, whose transaction
never commits (a worker process or thread would not see the rows), and in a
``TransactionTestCase``. ``enqueue_on_commit`` writes its row at once in the
test's transaction, so ``drain()`` and ``assert_enqueued`` see it in the same
test; ``captureOnCommitCallbacks`` plays no part in that.

pytest users get the same through the ``jobs`` and ``jobs_drain`` fixtures
(``django_jobs.pytest_plugin``); ``unittest`` users call these functions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.db.models.functions import Now
from django.utils import timezone

from django_jobs import conf, encryption, payloads, registry
from django_jobs.api import prepare
from django_jobs.context import JobContext
from django_jobs.exceptions import InvalidJob, InvalidPayload
from django_jobs.models import CompletionMarker, DeadLetter, Job
from django_jobs.registry import Handler
from django_jobs.rows import uuid7
from django_jobs.store import JobStore
from django_jobs.worker.attempt import call_handler
from django_jobs.worker.inline import InlineWorker, Reported

__all__ = [
    "MAX_ROUNDS",
    "ROUND_SIZE",
    "Attempt",
    "DrainError",
    "Drained",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued_jobs",
    "perform",
    "task_payload",
]

# drain() claims at most ROUND_SIZE jobs per round and stops with DrainError
# after MAX_ROUNDS rounds that still found work: a handler that enqueues itself
# (or fans out without end) fails the test instead of hanging it.
MAX_ROUNDS = 100
ROUND_SIZE = 100
# Enqueued jobs an assertion message lists before "and N more".
_LISTED = 20


# ---- what drain() returns ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt drain() ran, and how it ended."""

    id: uuid.UUID
    name: str
    queue: str
    payload: Any
    attempt: int
    outcome: str  # "succeeded", "retried", "dead" or "snoozed"
    error: BaseException | None = None  # what the handler raised (retried, dead)
    result: Any = None  # succeeded: the result its completion marker keeps
    reason: str | None = None  # dead: the DeadReason of its dead letter


@dataclass
class Drained:
    """What drain() did: every attempt in the order it ran, by outcome."""

    attempts: list[Attempt] = field(default_factory=list)
    rounds: int = 0

    def _with(self, outcome: str) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome == outcome]

    @property
    def succeeded(self) -> list[Attempt]:
        return self._with("succeeded")

    @property
    def retried(self) -> list[Attempt]:
        return self._with("retried")

    @property
    def dead(self) -> list[Attempt]:
        return self._with("dead")

    @property
    def snoozed(self) -> list[Attempt]:
        return self._with("snoozed")

    def __len__(self) -> int:
        return len(self.attempts)

    def __str__(self) -> str:
        return (
            f"{len(self.succeeded)} succeeded, {len(self.retried)} retried, "
            f"{len(self.dead)} dead, {len(self.snoozed)} snoozed in {self.rounds} round(s)"
        )


class DrainError(AssertionError):
    """drain() still found due jobs after its maximum of rounds."""

    def __init__(self, message: str, drained: Drained) -> None:
        super().__init__(message)
        self.drained = drained


# ---- drain ---------------------------------------------------------------------


def drain(
    queue: str | Iterable[str] | None = None,
    *,
    until_empty: bool = True,
    run_scheduled: bool = False,
    raise_errors: bool = False,
    max_rounds: int = MAX_ROUNDS,
    using: str | None = None,
) -> Drained:
    """Run due jobs here and now, through the worker's claim and settle; return what ran.

    `queue`: a queue name or names (default: every queue that holds jobs).
    `until_empty`: run again while jobs are due, so that retries without
    backoff and jobs the handlers enqueue run too (at most `max_rounds` claims
    of up to ROUND_SIZE jobs; then DrainError). False: one pass over the jobs
    due when drain() starts. `run_scheduled`: make jobs with a run time ahead
    due first, at every round: delayed jobs, retries waiting for their
    backoff, snoozed jobs. `raise_errors`: when a handler raises, give its job
    back without counting the attempt and raise the exception here. `using`: the
    job database to drain (default: every one, again while one's jobs enqueue
    jobs in another; `max_rounds` counts the claims of all of them).
    """
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be a positive integer, not {max_rounds!r}")
    fixed = _queues(queue)
    aliases = conf.databases()
    if using is not None and using not in aliases:
        raise ValueError(f"using={using!r} is not a job database: {', '.join(map(repr, aliases))}")
    drained = Drained()
    if using is not None or len(aliases) == 1:
        return _drain(
            using or aliases[0],
            fixed,
            drained,
            until_empty,
            run_scheduled,
            raise_errors,
            max_rounds,
        )
    while True:
        before = len(drained.attempts)
        for alias in aliases:
            _drain(alias, fixed, drained, until_empty, run_scheduled, raise_errors, max_rounds)
        if not until_empty or len(drained.attempts) == before:
            return drained


def _drain(
    alias: str,
    fixed: list[str] | None,
    drained: Drained,
    until_empty: bool,
    run_scheduled: bool,
    raise_errors: bool,
    max_rounds: int,
) -> Drained:
    """drain() on one job database, adding to `drained`."""
    jobs = Job.objects.using(alias)
    worker = InlineWorker(
        queues=fixed or [conf.get("DEFAULT_QUEUE")], concurrency=1, database=alias
    )
    claimable = Q(locked_by__isnull=True, run_at__lte=Now()) | Q(lease_expires_at__lt=Now())
    waits = 0  # claims that found due jobs held back (a flow limit) and waited
    while True:
        queues = fixed or sorted(set(jobs.values_list("queue", flat=True).distinct()))
        mine = jobs.filter(queue__in=queues)
        if run_scheduled:
            JobStore(jobs.db).run_now(mine)
        worker.queues = queues
        if until_empty:
            limit = ROUND_SIZE
            if drained.rounds + waits >= max_rounds:
                if queues and worker.due():
                    due = jobs.due_for(queues=queues, names=worker.names)
                    raise _too_many_rounds(due, drained, max_rounds, waits)
                return drained
        else:
            limit = mine.filter(claimable).count()
        if not queues or not limit:
            return drained
        attempts = _attempts(worker.round(limit, raise_errors=raise_errors), worker.database)
        if not worker.claimed_last:
            # Nothing claimed: done, unless the database still holds due jobs that a
            # limit held back (full slots, a rate window's starts): wait for it to admit.
            if not until_empty or not worker.due():
                return drained
            waits += 1
            time.sleep(worker.pause_before_looking_again())
            continue
        drained.rounds += 1
        drained.attempts += attempts
        if not until_empty:
            return drained


def _queues(queue: str | Iterable[str] | None) -> list[str] | None:
    if queue is None:
        return None
    try:
        names = [queue] if isinstance(queue, str) else list(queue)
    except TypeError:
        names = []
    if not names:
        raise InvalidJob("drain() needs a queue name, a list of them, or None for all queues")
    return [registry.check_queue(name, allowlist=False) for name in names]


def _too_many_rounds(due: Any, drained: Drained, max_rounds: int, waits: int) -> DrainError:
    names = ", ".join(
        f"{row['name']} x{row['n']}"
        for row in due.order_by().values("name").annotate(n=Count("pk")).order_by("-n")[:5]
    )
    held = (
        f" {waits} of them found only jobs a flow limit held back and waited for it."
        if waits
        else ""
    )
    return DrainError(
        f"drain() stopped after {max_rounds} rounds (claims of up to {ROUND_SIZE} jobs) "
        f"with jobs still due: {names}.{held} A handler may be enqueueing jobs without end; "
        f"if this many jobs is intended, pass a larger max_rounds. So far: {drained}.",
        drained,
    )


def _attempts(report: list[Reported], alias: str) -> list[Attempt]:
    """Turn the worker's reports into Attempts, with results and reasons as stored."""
    done = [r.job.idempotency_key for r in report if r.outcome == "succeeded"]
    results = dict(
        CompletionMarker.objects.using(alias).filter(key__in=done).values_list("key", "result")
    )
    dead = [r.job.id for r in report if r.outcome == "dead"]
    reasons = dict(DeadLetter.objects.using(alias).filter(id__in=dead).values_list("id", "reason"))
    attempts = []
    for job, outcome, error in report:
        try:
            payload = payloads.decode(job.payload)
        except ValueError:
            payload = job.payload
        attempts.append(
            Attempt(
                id=job.id,
                name=job.name,
                queue=job.queue,
                payload=payload,
                attempt=job.attempts,
                outcome=outcome,
                error=error if isinstance(error, BaseException) else None,
                result=results.get(job.idempotency_key) if outcome == "succeeded" else None,
                reason=reasons.get(job.id) if outcome == "dead" else None,
            )
        )
    return attempts


# ---- perform ---------------------------------------------------------------------


def perform(
    handler_or_name: Any,
    payload: Any = None,
    *,
    key: str | None = None,
    queue: str | None = None,
    attempt: int = 1,
    max_attempts: int | None = None,
) -> Any:
    """Run one handler as the worker would, without enqueueing; return its result or raise.

    The payload is validated and encoded as at enqueue (InvalidPayload), decoded
    and validated again as in the worker; an atomic handler runs in
    ``transaction.atomic``; the result is what a completion marker would keep
    (a JSON round trip; for a django.tasks Task, the function's return value).
    `attempt` and `max_attempts` set ``ctx.attempt`` and ``ctx.max_attempts``.
    """
    handler = _handler(handler_or_name)
    if handler.chunk is not None:
        raise InvalidJob(
            f"{handler.name} is a chunk handler (handler(payloads, ctx)): enqueue its jobs "
            "and run them with drain(), which runs them as chunks"
        )
    prepared = prepare(handler, payload, key, None, None, None, queue, max_attempts)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidJob(f"attempt must be a positive integer, not {attempt!r}")
    value = encryption.unseal(payloads.decode(prepared.payload), handler.encrypt)
    if handler.validate is not None:
        try:
            validated = handler.validate(value)
        except (ValueError, TypeError) as exc:
            raise InvalidPayload(f"payload rejected by {handler.name}'s validator: {exc}") from exc
        value = value if validated is None else validated
    now = timezone.now()
    ctx = JobContext(
        id=uuid7(),
        name=handler.name,
        queue=prepared.queue,
        attempt=attempt,
        max_attempts=prepared.max_attempts,
        enqueued_at=now,
        dedupe_key=prepared.key,
        worker_id="django_jobs.testing",
        database=conf.database(),
        started_at=now,
    )
    if handler.atomic:
        with transaction.atomic(using=conf.database()):
            result = payloads.encode_result(call_handler(handler, value, ctx))
    else:
        result = payloads.encode_result(call_handler(handler, value, ctx))
    stored = None if result is None else json.loads(result)
    if getattr(handler, "task", None) is not None and isinstance(stored, dict):
        return stored.get("return_value")  # a Task's marker keeps an envelope
    return stored


# ---- what was enqueued ---------------------------------------------------------


def enqueued_jobs(
    handler_or_name: Any = None,
    payload: Any = None,
    *,
    queue: str | None = None,
    key: str | None = None,
) -> list[Job]:
    """Return the live jobs (waiting, scheduled or running) that match, oldest first.

    `payload` None matches any payload; otherwise it must equal the job's
    payload as JSON (dict key order aside; 1 and 1.0 and True differ).
    """
    found: list[Job] = []
    for alias in conf.databases():  # every job database, oldest first in each
        jobs = Job.objects.using(alias).order_by("enqueued_at", "id")
        if handler_or_name is not None:
            jobs = jobs.filter(name=_handler(handler_or_name).name)
        if queue is not None:
            jobs = jobs.filter(queue=queue)
        if key is not None:
            jobs = jobs.filter(key=key)
        found += jobs
    if payload is None:
        return found
    wanted = _canonical(payloads.encode(payload))
    return [job for job in found if _canonical(_plain(job)) == wanted]


def _plain(job: Job) -> str:
    """Return a job's payload as JSON text, decrypted if its handler encrypts it."""
    handler = registry.lookup(job.name)
    if handler is None or handler.encrypt is None:
        return job.payload
    try:
        return payloads.encode(encryption.unseal(payloads.decode(job.payload), handler.encrypt))
    except encryption.Undecryptable:
        return job.payload


def assert_enqueued(
    handler_or_name: Any,
    payload: Any = None,
    *,
    queue: str | None = None,
    key: str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Fail unless a matching job is enqueued (exactly `count` of them, if given); return them."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be a non-negative integer, not {count!r}")
    found = enqueued_jobs(handler_or_name, payload, queue=queue, key=key)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    wanted = "a job" if count is None else f"{count} job{'s' if count != 1 else ''}"
    raise AssertionError(
        f"expected {wanted} {_described(handler_or_name, payload, queue, key)} enqueued, "
        f"found {len(found)}.\n{_listing()}"
    )


def assert_not_enqueued(
    handler_or_name: Any = None,
    payload: Any = None,
    *,
    queue: str | None = None,
    key: str | None = None,
) -> None:
    """Fail if a matching job is enqueued (with no arguments: if any job is)."""
    found = enqueued_jobs(handler_or_name, payload, queue=queue, key=key)
    if found:
        raise AssertionError(
            f"expected no job {_described(handler_or_name, payload, queue, key)} enqueued, "
            f"found {len(found)}.\n{_listing()}"
        )


def task_payload(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Return the job payload of a django.tasks call: ``{"args": [...], "kwargs": {...}}``."""
    from django_jobs.tasks.handlers import payload

    return payload(args, kwargs)


def _handler(handler_or_name: Any) -> Handler:
    """Return the registered handler of a @job, a job name, or a django.tasks Task."""
    if isinstance(handler_or_name, Handler | str):
        name = handler_or_name if isinstance(handler_or_name, str) else handler_or_name.name
        return registry.get_handler(registry.check_name(name))
    if find_spec("django.tasks") is not None:
        from django.tasks import Task

        if isinstance(handler_or_name, Task):
            from django_jobs.tasks.backend import JobsBackend

            handler = registry.lookup(handler_or_name.module_path)
            ours = isinstance(handler_or_name.get_backend(), JobsBackend)
            if not ours or handler is None or getattr(handler, "task", None) is None:
                raise InvalidJob(
                    f"task {handler_or_name.module_path} does not run on django-jobs: its "
                    f"backend is {handler_or_name.backend!r}, not a django_jobs JobsBackend"
                )
            return handler
    raise InvalidJob(
        "expected a @job handler, its name or a django.tasks Task, "
        f"not {type(handler_or_name).__name__}"
    )


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _described(handler_or_name: Any, payload: Any, queue: str | None, key: str | None) -> str:
    parts = []
    if handler_or_name is not None:
        parts.append(_handler(handler_or_name).name)
    if payload is not None:
        parts.append(f"with payload {payloads.encode(payload)}")
    if queue is not None:
        parts.append(f"on queue {queue!r}")
    if key is not None:
        parts.append(f"with key {key!r}")
    return " ".join(parts) or "(any)"


def _listing() -> str:
    """List the live jobs, so that a failed assertion shows what was enqueued instead."""
    several = len(conf.databases()) > 1
    found: list[tuple[str, Job]] = []
    total = 0
    for alias in conf.databases():
        jobs = Job.objects.using(alias).with_state().order_by("enqueued_at", "id")
        total += jobs.count()
        found += [(alias, job) for job in jobs[: _LISTED - len(found)]]
    if not total:
        return "No jobs are enqueued."
    lines = [f"Enqueued jobs ({total}):"]
    for alias, job in found:
        text = job.payload if len(job.payload) <= 200 else job.payload[:200] + "…"
        extra = f" key={job.key!r}" if job.key is not None else ""
        lines.append(
            f"  {job.name} {text} queue={job.queue!r} priority={job.priority}{extra} ({job.state})"  # type: ignore[attr-defined]  # with_state's
            + (f" on {alias!r}" if several else "")
        )
    if total > _LISTED:
        lines.append(f"  … and {total - _LISTED} more")
    return "\n".join(lines)
