"""Where the work of a job is now: live (its state), finished (its marker) or dead (its letter).

A workflow step, or the parent a blocked job waits for, is named by the id its job
had when the row was written. That job may have finished (its completion marker has
its id), died (its dead letter has its id) or died and been replayed (the letter's
``replay_job_id`` is the new job, which is followed, up to ``REPLAY_HOPS`` letters).
``resolve`` answers for many ids in a few queries per hop; ``state_annotation`` does
the first hop in SQL, for counts over workflows too big to read into memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Case, Exists, OuterRef, Subquery, Value, When
from django.db.models import CharField as CharFieldType
from django.db.models.functions import Coalesce
from django.utils.translation import gettext_lazy as _

from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Job,
    JobState,
    WorkflowStep,
)

# States a step can be in, beyond the live JobStates.
DONE = "done"
DEAD = "dead"
REPLAYED = "replayed"  # only from state_annotation: the letter was replayed, follow it
GONE = "gone"  # no row at all: its marker was pruned (or a hand-deleted row)

LABELS: dict[str, Any] = {
    JobState.WAITING: JobState.WAITING.label,
    JobState.SCHEDULED: JobState.SCHEDULED.label,
    JobState.RUNNING: JobState.RUNNING.label,
    JobState.BLOCKED: JobState.BLOCKED.label,
    DONE: _("done"),
    DEAD: _("dead"),
    GONE: _("gone"),
}
# The order of the legend and of the counts: the way work moves.
ORDER = [
    JobState.BLOCKED,
    JobState.SCHEDULED,
    JobState.WAITING,
    JobState.RUNNING,
    DONE,
    DEAD,
    GONE,
]
LIVE = {JobState.BLOCKED, JobState.SCHEDULED, JobState.WAITING, JobState.RUNNING}

REPLAY_HOPS = 10  # letters followed through their replays, a bound against a hand-made loop
CHUNK = 2000  # ids per IN (...) list


@dataclass(frozen=True)
class Where:
    """The work of one id now: its state and the row that shows it."""

    state: str
    current: uuid.UUID  # the live job's, the marker's or the letter's id (a replay's, if any)
    reason: str = ""  # a dead letter's reason
    waiting_for: int = 0  # a blocked job's parents not finished
    replays: int = 0  # dead letters followed to get here

    @property
    def admin_model(self) -> str | None:
        """The admin's model name of the row that shows it (None: no row)."""
        if self.state in LIVE:
            return "job"
        return {DONE: "completionmarker", DEAD: "deadletter"}.get(self.state)

    @property
    def label(self) -> str:
        return str(LABELS.get(self.state, self.state))


def _chunks(ids: list[uuid.UUID]) -> Iterable[list[uuid.UUID]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]


def resolve(ids: Iterable[uuid.UUID], alias: str) -> dict[uuid.UUID, Where]:
    """Find where the work of each id is now; ids with no row at all are GONE."""
    found: dict[uuid.UUID, Where] = {}
    # original id -> the id looked at now
    todo = {job_id: job_id for job_id in ids}
    for hop in range(REPLAY_HOPS + 1):
        if not todo:
            break
        looking = list(set(todo.values()))
        at: dict[uuid.UUID, Where] = {}
        follow: dict[uuid.UUID, uuid.UUID] = {}
        for chunk in _chunks(looking):
            jobs = Job.objects.using(alias).filter(id__in=chunk).with_state()
            rows = jobs.values_list("id", "state", "waiting_for")  # type: ignore[misc]  # with_state's annotation
            for job_id, state, waiting_for in rows:
                at[job_id] = Where(state, job_id, waiting_for=waiting_for, replays=hop)
        rest = [job_id for job_id in looking if job_id not in at]
        for chunk in _chunks(rest):
            markers = CompletionMarker.objects.using(alias).filter(job_id__in=chunk)
            for job_id in markers.values_list("job_id", flat=True):
                at[job_id] = Where(DONE, job_id, replays=hop)
        rest = [job_id for job_id in rest if job_id not in at]
        for chunk in _chunks(rest):
            letters = DeadLetter.objects.using(alias).filter(id__in=chunk)
            for job_id, reason, replay in letters.values_list("id", "reason", "replay_job_id"):
                if replay is not None and hop < REPLAY_HOPS:
                    follow[job_id] = replay
                else:
                    at[job_id] = Where(DEAD, job_id, reason=reason, replays=hop)
        following: dict[uuid.UUID, uuid.UUID] = {}
        for original, current in todo.items():
            if current in at:
                found[original] = at[current]
            elif current in follow:
                following[original] = follow[current]
            else:
                found[original] = Where(GONE, current, replays=hop)
        todo = following
    return found


def state_annotation(field: str = "job_id") -> Coalesce:
    """The state of the job whose id is in `field`, in SQL; a replayed letter is REPLAYED.

    One index probe per table at most, live jobs first (the usual step of a running
    workflow): for 50,000 live steps about 0.36 s, where an EXISTS before the live
    state's subquery took about 0.46 s (tests/test_admin_scale.py's rows).
    """
    job_id = OuterRef(field)
    text = CharFieldType()
    live = Job.objects.filter(id=job_id).with_state().values("state")  # type: ignore[misc]  # with_state's annotation
    letter = (
        DeadLetter.objects.filter(id=job_id)
        .annotate(
            state=Case(
                When(replay_job_id__isnull=False, then=Value(REPLAYED)),
                default=Value(DEAD),
                output_field=text,
            )
        )
        .values("state")
    )
    done = Case(
        When(Exists(CompletionMarker.objects.filter(job_id=job_id)), then=Value(DONE)),
        default=None,
        output_field=text,
    )
    return Coalesce(
        Subquery(live[:1], output_field=text),
        done,
        Subquery(letter[:1], output_field=text),
        Value(GONE),
        output_field=text,
    )


def replayed_as(ids: Iterable[uuid.UUID], alias: str) -> dict[uuid.UUID, uuid.UUID]:
    """The last replay of each id that is a replayed letter (chains followed); one query a hop.

    A replay moves its step's row to the new job, while the edges of the step's
    dependents keep naming the id they were written with: this maps one to the other.
    """
    found: dict[uuid.UUID, uuid.UUID] = {}
    todo = {job_id: job_id for job_id in ids}
    for _hop in range(REPLAY_HOPS):
        if not todo:
            break
        replays: dict[uuid.UUID, uuid.UUID] = {}
        for chunk in _chunks(list(set(todo.values()))):
            letters = DeadLetter.objects.using(alias).filter(
                id__in=chunk, replay_job_id__isnull=False
            )
            for letter_id, replay in letters.values_list("id", "replay_job_id"):
                if replay is not None:  # filtered so: for the type checker
                    replays[letter_id] = replay
        todo = {original: replays[now] for original, now in todo.items() if now in replays}
        found.update(todo)
    return found


def step_of(job_id: uuid.UUID, alias: str) -> tuple[str, uuid.UUID] | None:
    """Return the workflow and step id of a job (its row, its replay's or its letter's).

    A replay moves the step's row to its job, so a replayed letter finds it
    forward; a row written before replays moved rows stays at the id of the
    letter the job was replayed from, found backward.
    """

    def workflow_of(step_id: uuid.UUID) -> str | None:
        steps = WorkflowStep.objects.using(alias).filter(job_id=step_id)
        return steps.values_list("workflow", flat=True).first()

    workflow = workflow_of(job_id)
    if workflow is not None:
        return workflow, job_id
    later = replayed_as([job_id], alias).get(job_id)
    if later is not None and (workflow := workflow_of(later)) is not None:
        return workflow, later
    for _hop in range(REPLAY_HOPS):
        letters = DeadLetter.objects.using(alias).filter(replay_job_id=job_id)
        earlier = letters.values_list("id", flat=True).first()
        if earlier is None:
            return None
        job_id = earlier
        workflow = workflow_of(job_id)
        if workflow is not None:
            return workflow, job_id
    return None
