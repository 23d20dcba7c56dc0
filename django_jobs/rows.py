"""The values that cross the layers: what enqueue hands the store, what a claim hands the worker.

Frozen dataclasses and named tuples, no database: the enqueue API builds ``NewJob``
and ``Step``; the store (django_jobs.store) writes them and answers with
``EnqueueResult``, ``ClaimedJob``, ``Settled``, ``Leases`` and the reports; the
worker asks for jobs with a ``ClaimRequest`` and settles ``Finished`` ones. Below the
registry (which returns EnqueueResult), above the leaves.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django_jobs.attempts import usable_errors, worker_of
from django_jobs.payloads import safe_str, storable_text

if TYPE_CHECKING:
    from django_jobs import flow


def uuid7() -> uuid.UUID:
    """Return a time-ordered UUID (RFC 9562 version 7): ids sort roughly by creation."""
    ms = time.time_ns() // 1_000_000
    # Ids must be unique, not secret: the module PRNG (seeded from os.urandom and
    # reseeded in forked children) is 20x cheaper than a syscall per id.
    rand = random.getrandbits(80)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | rand
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # RFC 4122 variant
    return uuid.UUID(int=value)


@dataclass(frozen=True, slots=True)
class Beat:
    """What a claim writes to the worker's heartbeat row (see WorkerBeat)."""

    worker: str
    running: int
    stats: str | None = None  # JSON text of the worker's counters, or None to keep them


@dataclass(slots=True)
class ClaimedJob:
    """A job row as a worker holds it between claim and settle."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    attempts: int
    max_attempts: int
    key: str | None
    fingerprint: str | None
    enqueued_at: datetime
    started_at: datetime | None
    errors: list[dict[str, Any]]
    token: str
    completed: bool = False  # a completion marker for its key already exists
    dependents: int = 0  # jobs waiting for it, as claimed (the settle's fence, sql.COMPLETE)
    extra: dict[str, Any] = field(default_factory=dict)
    # Tracing (django_jobs.tracing): when it was due, and its producer's W3C context.
    run_at: datetime | None = None
    trace_context: str | None = None
    # The last progress the worker wrote to its row (context.JobContext.progress).
    progress: dict[str, Any] | None = None
    # Not claimed (nothing that runs a job reads them): read when its letter is written.
    tags: list[str] | None = None
    meta: dict[str, str] | None = None

    @property
    def idempotency_key(self) -> str:
        return self.key if self.key is not None else str(self.id)

    @property
    def worker_id(self) -> str:
        return worker_of(self.token)

    def malformed(self) -> str | None:
        """Say which column of this row no worker can use as it is, or None when all are fine."""
        errors = self.errors
        if (  # every claimed job asks: the common answer first, without a loop
            type(errors) is list
            and not errors
            and type(self.attempts) is int
            and type(self.max_attempts) is int
            and type(self.priority) is int
            and type(self.name) is str
            and type(self.queue) is str
            and type(self.payload) is str
        ):
            return None
        if not isinstance(errors, list) or not all(type(e) is dict for e in errors):
            return f"its errors column is not a list of error objects: {_preview(errors)}"
        for name in ("attempts", "max_attempts", "priority"):
            if type(getattr(self, name)) is not int:
                return f"its {name} column is not an integer: {_preview(getattr(self, name))}"
        for name in ("name", "queue", "payload"):
            if type(getattr(self, name)) is not str:
                return f"its {name} column is not text: {_preview(getattr(self, name))}"
        return None

    def make_storable(self) -> None:
        """Replace what malformed() finds with usable values, so that a letter can be written."""
        self.errors = usable_errors(self.errors)
        for name, default in (("attempts", 0), ("max_attempts", 1), ("priority", 0)):
            if type(getattr(self, name)) is not int:
                setattr(self, name, default)
        for name in ("name", "queue", "payload"):
            if type(getattr(self, name)) is not str:
                setattr(self, name, storable_text(_preview(getattr(self, name))))


def _preview(value: Any) -> str:
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001 - whatever a row decodes to, describe it
        text = safe_str(type(value))
    return storable_text(text, 200)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What enqueue did: the job's id, and whether an existing job already had its key.

    ``duplicate`` is None only for ``enqueue_on_commit(..., commit_of=other_alias)``,
    whose row is written after that other database commits. ``enqueued_at`` is the
    time written in the new row (the database's on PostgreSQL); None when no row
    was written yet, or for a duplicate. ``database`` is the alias of the job database
    that holds the job (docs/scaling.md).
    """

    id: uuid.UUID
    duplicate: bool | None
    name: str
    queue: str
    enqueued_at: datetime | None = None
    database: str = "default"


@dataclass(slots=True)  # not frozen: frozen dataclasses cost a setattr call per field
class NewJob:
    """A validated job row to insert (the enqueue API builds it, JobStore.insert writes it)."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    run_at: datetime | None  # None: `delay` seconds from now, on the database clock
    delay: float
    max_attempts: int
    key: str | None
    fingerprint: str | None
    partition: str | None = None  # flow control's partition value (registry.Handler.partition_by)
    # Workflows: parents not finished yet (run_at is then BLOCKED_UNTIL), and the
    # dependents registered on it before it is written (the steps of one workflow).
    waiting_for: int = 0
    dependents: int = 0
    # A blocked job's own timing, kept for its release (see _block): due that long
    # after its last parent finishes, and not before that time.
    release_delay: timedelta | None = None
    not_before: datetime | None = None
    # The W3C context of its producer span (django_jobs.tracing), None untraced.
    trace_context: str | None = None
    # Labels to filter by (limits.tags, limits.meta); None for none.
    tags: list[str] | None = None
    meta: dict[str, str] | None = None
    # Other fingerprints a holder of its key may have for the same work: an encrypted
    # job's under each key of ENCRYPTION_KEYS (keys rotate), so it stays a duplicate.
    also_fingerprints: tuple[str, ...] = ()


# What a job is, apart from its runs: its dead letter keeps these, a replay gives them back.
DEFINITION = (
    "name",
    "queue",
    "payload",
    "priority",
    "max_attempts",
    "key",
    "fingerprint",
    "trace_context",
    "tags",
    "meta",
)


def definition(job: Any) -> dict[str, Any]:
    """Return the DEFINITION fields of a job, a claimed job or a dead letter, by name."""
    return {field: getattr(job, field) for field in DEFINITION}


@dataclass(frozen=True)
class Leases:
    """What JobStore.extend_leases() found of the leases it was asked to extend."""

    # Each job still held, mapped to whether an operator asked to cancel it.
    held: dict[uuid.UUID, bool]
    # The jobs held by another token now, or settled by another attempt (or an operator).
    lost: frozenset[uuid.UUID]


class Settled(set[int]):
    """The positions JobStore.complete() settled; `woke`: it made waiting jobs due."""

    woke: bool = False


@dataclass(frozen=True, slots=True)
class Parent:
    """A job named in `after`: by id (an EnqueueResult's, or a UUID), or by dedupe key.

    With both, the id is looked up first and the key (the id's text, given as a
    string) after it.
    """

    id: uuid.UUID | None = None
    key: str | None = None

    def __str__(self) -> str:
        return str(self.id) if self.id is not None else repr(self.key)


@dataclass(slots=True)
class Step:
    """A validated workflow step (api.Workflow makes them, JobStore.insert_workflow writes them).

    `parents` holds the index of an earlier step of the same workflow, or a
    Parent outside it.
    """

    job: NewJob
    parents: list[int | Parent]
    on_parent_dead: str = "wait"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


@dataclass
class CancelReport:
    """What JobStore.cancel did, job ids by outcome."""

    cancelled: list[uuid.UUID] = field(default_factory=list)
    blocked: int = 0  # of the cancelled: workflow steps waiting for their parents
    scheduled: int = 0  # of the cancelled: due later; the others were due (waiting)
    running: list[uuid.UUID] = field(default_factory=list)  # leased: left alone
    gone: list[uuid.UUID] = field(default_factory=list)  # finished or moved meanwhile

    def __str__(self) -> str:
        parts = [f"{len(self.cancelled)} cancelled"]
        if self.running:
            parts.append(f"{len(self.running)} running (not cancelled)")
        if self.gone:
            parts.append(f"{len(self.gone)} no longer live")
        return ", ".join(parts)


@dataclass
class ReplayReport:
    """What a replay (control.replay) did, dead-letter ids by outcome."""

    replayed: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)  # letter -> new job
    already: list[uuid.UUID] = field(default_factory=list)  # replayed before
    key_taken: list[uuid.UUID] = field(default_factory=list)  # a live job holds the key
    completed: list[uuid.UUID] = field(default_factory=list)  # the key's work is done
    unknown: list[uuid.UUID] = field(default_factory=list)  # no handler by that name
    cycles: list[uuid.UUID] = field(default_factory=list)  # it would wait for its own waiters

    def add(self, other: ReplayReport) -> None:
        """Add the outcomes of other (a later batch) to this report."""
        self.replayed.update(other.replayed)
        self.already += other.already
        self.key_taken += other.key_taken
        self.completed += other.completed
        self.unknown += other.unknown
        self.cycles += other.cycles

    @property
    def total(self) -> int:
        return (
            len(self.replayed)
            + len(self.already)
            + len(self.key_taken)
            + len(self.completed)
            + len(self.unknown)
            + len(self.cycles)
        )

    def __str__(self) -> str:
        parts = [f"{len(self.replayed)} replayed"]
        if self.already:
            parts.append(f"{len(self.already)} already replayed")
        if self.key_taken:
            parts.append(
                _plural(
                    len(self.key_taken), "whose key a live job holds", "whose keys live jobs hold"
                )
            )
        if self.completed:
            parts.append(f"{len(self.completed)} whose key has completed since")
        if self.unknown:
            parts.append(f"{len(self.unknown)} with no handler registered under its name")
        if self.cycles:
            parts.append(f"{len(self.cycles)} that would close a cycle (docs/workflows.md)")
        return ", ".join(parts)


class Finished(NamedTuple):
    """A job its handler finished, to settle as done (JobStore.complete)."""

    id: uuid.UUID
    token: str  # the lease it was claimed under: another worker's lease is left alone
    result: str | None  # the handler's return value as JSON text
    dependents: int  # jobs waiting for it, as its claim counted them (the settle's fence)


class ClaimRequest(NamedTuple):
    """What a worker asks a claim for (JobStore.claim, JobStore.complete_and_claim).

    Up to `limit` jobs of `queues`, leased to `token` for `lease` seconds. Jobs whose
    name is not in `names` (None: any name) or is in `exclude_names` are left out.
    With `beat`, the worker's heartbeat row is refreshed in the same statement. The
    jobs of `flow_limits`' groups are claimed within their limits (PostgreSQL only;
    docs/flow-control.md); `flow_claim` names the groups (Limit.key) whose jobs to
    claim now (None: all), and jobs of no limited group are claimed only with
    `others` (or `beat`: the heartbeat rides on their claim).
    """

    queues: Sequence[str]
    limit: int
    token: str
    lease: float
    exclude_names: Sequence[str] = ()
    beat: Beat | None = None
    names: Sequence[str] | None = None
    flow_limits: Sequence[flow.Limit] = ()
    flow_claim: Collection[str] | None = None
    others: bool = True


class ReplayRequest(NamedTuple):
    """What a replay of dead letters is asked (JobStore.replay; control.replay makes it)."""

    by: str  # who replays: written on each letter
    run_at: datetime | None  # the new jobs' run time (None: `delay` from now)
    delay: float  # seconds from now, on the database clock
    # The handlers registered, by name: each one's partition_by (None: no partitions). A
    # letter of a name not here is not replayed (ReplayReport.unknown).
    partition_by: Mapping[str, Any]
    progress: Callable[[int, int], None] | None = None  # (done, total) after each batch
