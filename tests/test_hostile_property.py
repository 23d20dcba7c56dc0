"""Property: whatever a batch of handlers raises, returns or prints, a real one-thread burst
worker ends every job as a marker or a dead letter with its true cause, runs ordinary jobs
exactly once, and exits 0 on its own within its lease and a few seconds."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from django_jobs import enqueue
from django_jobs.attempts import MAX_MESSAGE
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.payloads import storable_text
from tests.testapp import hostile, jobs
from tests.testapp.models import Audit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 3
UNSTORABLE = "django_jobs.exceptions.UnstorableResult"

# Texts a JSON payload can carry (no lone surrogates); NUL and surrogates are added by flags.
plain_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
messages = st.fixed_dictionaries(
    {
        "text": plain_text,
        "nul": st.booleans(),
        "surrogate": st.booleans(),
        "repeat": st.sampled_from([1, 1, 1, 500, 2_000_000]),  # up to megabytes
    }
)
storable = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=10),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.text(max_size=5).filter(lambda k: "\x00" not in k), children, max_size=3
        )
    ),
    max_leaves=8,
)
unstorable = st.sampled_from(
    [
        {"kind": "text", "text": "abcdef", "nul": True},
        {"kind": "dict", "value": {"text": "abcdef", "surrogate": True}},
        {"kind": "dict", "key": {"text": "abcdef", "nul": True}},
        {"kind": "nan"},
        {"kind": "inf"},
        {"kind": "set"},
    ]
)
behaviours = st.one_of(
    st.fixed_dictionaries(
        {
            "handler": st.sampled_from(["tests.hostile", "tests.hostile_atomic"]),
            "raise": st.sampled_from(sorted(hostile.RAISES)),
            "message": messages,
        }
    ),
    st.fixed_dictionaries(
        {
            "handler": st.sampled_from(["tests.hostile", "tests.hostile_atomic"]),
            "return": storable.map(lambda v: {"json": v}) | unstorable,
            "print": st.sampled_from([0, 0, 200_000]),
        }
    ),
    st.fixed_dictionaries({"handler": st.just("tests.hostile_async"), "cancelled": st.just(True)}),
    st.fixed_dictionaries(
        {
            "handler": st.just("tests.hostile_async"),
            "raise": st.sampled_from(sorted(hostile.RAISES)),
            "message": messages,
        }
    ),
)


def same(stored, returned):
    """Equal as JSON: jsonb writes 2.192071923477231e16 back as the integer 21920719234772310."""
    if isinstance(returned, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == returned.keys()
            and all(same(stored[k], returned[k]) for k in returned)
        )
    if isinstance(returned, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(returned)
            and all(same(a, b) for a, b in zip(stored, returned, strict=True))
        )
    if isinstance(returned, int | float) and not isinstance(returned, bool):
        return (
            isinstance(stored, int | float)
            and not isinstance(stored, bool)
            and (float(stored) == float(returned))
        )
    return type(stored) is type(returned) and stored == returned


def expected(behaviour):
    """(outcome, detail): ("marker", result) or ("dead", (reason, attempts, type, message))."""
    if behaviour.get("cancelled"):
        return "dead", (DeadReason.ATTEMPTS_EXHAUSTED, 2, "asyncio.exceptions.CancelledError", "")
    if "raise" in behaviour:
        name = behaviour["raise"]
        message = storable_text(hostile.text(behaviour["message"]), MAX_MESSAGE)
        if name == "BadStr":
            message = "<BadStr object: str() failed>"
        if name == "FatalError":
            return "dead", (DeadReason.FATAL, 1, hostile.RECORDED[name], message)
        return "dead", (DeadReason.ATTEMPTS_EXHAUSTED, 2, hostile.RECORDED[name], message)
    returned = behaviour["return"]
    if "json" in returned:
        return "marker", returned["json"]
    return "dead", (DeadReason.ATTEMPTS_EXHAUSTED, 2, UNSTORABLE, None)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batch=st.lists(behaviours, min_size=1, max_size=6),
    ordinary=st.integers(1, 4),
    order=st.randoms(use_true_random=False),
)
@example(  # jsonb gives this float back as an integer: still the value returned
    batch=[{"handler": "tests.hostile", "return": {"json": 2.192071923477231e16}, "print": 0}],
    ordinary=1,
    order=random.Random(0),
)
def test_hostile_handlers_never_wedge_crash_or_loop_a_worker(
    worker_process, batch, ordinary, order
):
    for model in (Job, CompletionMarker, DeadLetter, Audit):  # a failed example may leave rows
        model.objects.all().delete()
    work = [("hostile", b) for b in batch] + [("ordinary", i) for i in range(ordinary)]
    order.shuffle(work)
    enqueued = []
    for kind, item in work:
        if kind == "ordinary":
            enqueued.append((kind, item, enqueue(jobs.record, {"label": f"ordinary-{item}"}).id))
        else:
            payload = {k: v for k, v in item.items() if k != "handler"}
            enqueued.append((kind, item, enqueue(item["handler"], payload).id))
    worker = worker_process("--burst", "--concurrency", "1", "--lease", str(LEASE))
    code = worker.wait(timeout=LEASE + 12)  # startup, under load, is most of it
    assert code == 0, worker.output()[-3000:]

    assert Job.objects.count() == 0
    for kind, item, job_id in enqueued:
        if kind == "ordinary":
            assert CompletionMarker.objects.filter(job_id=job_id).exists()
            assert Audit.objects.filter(label=f"ordinary-{item}").count() == 1  # exactly once
            continue
        outcome, detail = expected(item)
        does = "raises" if "raise" in item else "is cancelled" if "cancelled" in item else "returns"
        event(f"{item['handler']} {does}: {outcome}")
        if outcome == "marker":
            result = CompletionMarker.objects.get(job_id=job_id).result
            assert same(result, detail), (result, detail)
            assert not DeadLetter.objects.filter(id=job_id).exists()
            continue
        reason, attempts, kind_, message = detail
        letter = DeadLetter.objects.get(id=job_id)
        assert (letter.reason, letter.attempts) == (reason, attempts)
        assert [e["type"] for e in letter.errors] == [kind_] * attempts
        if message is not None:
            assert letter.errors[-1]["message"] == message
        assert len(letter.error) <= MAX_MESSAGE + 400
