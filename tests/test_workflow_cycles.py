"""Cycles through a dead letter's key are refused (issue 22, point 5; docs/workflows.md "Cycles").

A dead letter does not hold its key: jobs may wait for the key (after= the letter)
and a job of the key may be enqueued again. Enqueued after one of its own waiters,
that job would wait for them and they for it, with nothing to release either.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management import call_command
from django.db import connections, transaction

from django_jobs import enqueue, workflow
from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job
from tests.conftest import ENGINE
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)
STEP = "tests.bb.step"
FRAGILE = "tests.bb.fragile"


def _dead(*keys):
    """Dead-letter a job of each key (tests.bb.fragile fails for good until healed)."""
    for key in keys:
        enqueue(FRAGILE, {"label": key}, key=key)
    call_command("runjobs", "--burst")
    assert set(DeadLetter.objects.values_list("key", flat=True)) >= set(keys)


def _state():
    return (
        sorted(Job.objects.values_list("id", "key", "waiting_for", "dependents")),
        sorted(Dependency.objects.values_list("job_id", "parent_key", "satisfied_at")),
    )


def test_a_dead_keys_job_after_its_own_waiter_is_refused_and_nothing_is_written():
    _dead("kx")
    ky = enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    before = _state()
    with pytest.raises(InvalidJob) as refused:
        enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["ky"])
    message = str(refused.value)
    assert "cycle" in message
    assert "'kx'" in message and "'ky'" in message, message
    assert _state() == before
    # Without the cycle it goes in, and its run releases the waiter.
    Audit.objects.create(label="bbheal|kx")
    again = enqueue(FRAGILE, {"label": "kx"}, key="kx")
    assert Job.objects.get(id=again.id).dependents == 1
    call_command("runjobs", "--burst")
    assert CompletionMarker.objects.filter(job_id=ky.id).exists()
    assert not Job.objects.exists()


def test_a_longer_cycle_is_refused_and_named():
    _dead("kx")
    enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    plain = enqueue(STEP, {"label": "mid"}, after=["ky"])  # no key: waited for by its id
    enqueue(STEP, {"label": "kz"}, key="kz", after=[plain])
    before = _state()
    with pytest.raises(InvalidJob) as refused:
        enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["kz"])
    message = str(refused.value)
    assert f"'kz', which waits for '{plain.id}', which waits for 'ky', which waits for 'kx'" in (
        message
    ), message
    assert _state() == before


def test_a_dead_keys_job_after_unrelated_parents_is_accepted():
    _dead("kx")
    enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    other = enqueue(STEP, {"label": "other"}, key="other")
    again = enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["other"])
    assert not again.duplicate
    assert Job.objects.get(id=again.id).dependents == 1  # ky waits for it
    assert Job.objects.get(id=other.id).dependents == 1


def test_a_workflow_step_that_would_close_a_cycle_is_refused_with_the_whole_workflow():
    _dead("kx")
    enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    before = _state()
    with pytest.raises(InvalidJob, match="cycle"), workflow(name="loop") as w:
        first = w.enqueue(STEP, {"label": "a"}, after=["ky"])
        w.enqueue(FRAGILE, {"label": "kx"}, key="kx", after=[first])
    assert _state() == before
    with pytest.raises(InvalidJob, match="cycle"), workflow(name="direct") as w:
        w.enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["ky"])
    assert _state() == before


def test_a_replayed_letter_that_waited_for_the_key_counts_as_a_waiter():
    # ky is dead-lettered while it waits (cancelled): its replay would wait for kx again.
    from django_jobs.control import cancel

    _dead("kx")
    ky = enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    cancel([ky.id])
    assert DeadLetter.objects.filter(id=ky.id, replayed_at__isnull=True).exists()
    with pytest.raises(InvalidJob, match="cycle"):
        enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["ky"])


def _race(first_enqueue, second_enqueue):
    """Run first_enqueue in a transaction held open while second_enqueue runs in another.

    Returns what each returned or raised, and whether the second waited for the first.
    """
    holding, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def first():
        try:
            with transaction.atomic():
                outcome["first"] = first_enqueue()
                holding.set()
                release.wait(30)
        except Exception as exc:  # reported to the test
            outcome["first"] = exc
            holding.set()
        finally:
            connections.close_all()

    def second():
        try:
            with transaction.atomic():
                outcome["second"] = second_enqueue()
        except Exception as exc:  # reported to the test
            outcome["second"] = exc
        finally:
            connections.close_all()

    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(30)
    two = threading.Thread(target=second)
    two.start()
    time.sleep(0.5)  # the second reaches the first's locks (the outcome says if it did not)
    waited = two.is_alive()
    release.set()
    one.join(30)
    two.join(30)
    return outcome["first"], outcome["second"], waited


@pytest.mark.skipif(ENGINE == "sqlite", reason="one writer at a time: no two transactions at once")
def test_two_transactions_building_the_two_halves_at_once_cannot_both_commit():
    # Both keys dead: one transaction enqueues kx after ky, the other ky after kx.
    # Each alone is no cycle; together they are one. The second waits for the
    # first's locks, then sees its edge and is refused.
    _dead("kx", "ky")
    first, second, waited = _race(
        lambda: enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["ky"]),
        lambda: enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"]),
    )
    assert not isinstance(first, Exception), first
    assert isinstance(second, InvalidJob), second
    assert "cycle" in str(second)
    assert waited, "the second transaction did not wait for the first"
    assert sorted(Job.objects.values_list("key", flat=True)) == ["kx"]


@pytest.mark.skipif(ENGINE == "sqlite", reason="one writer at a time: no two transactions at once")
def test_two_transactions_closing_a_longer_cycle_through_waiting_jobs_cannot_both_commit():
    # ka waits for k1's letter, kb for k2's; one transaction enqueues k1 after ka,
    # the other k2 after kb: k1 -> ka -> k2 -> kb -> k1 once both commit. The two
    # meet on the waiting jobs' rows (the walk locks them, the enqueue counts them).
    _dead("k1", "k2")
    enqueue(STEP, {"label": "ka"}, key="ka", after=["k2"])
    enqueue(STEP, {"label": "kb"}, key="kb", after=["k1"])
    first, second, waited = _race(
        lambda: enqueue(FRAGILE, {"label": "k1"}, key="k1", after=["ka"]),
        lambda: enqueue(FRAGILE, {"label": "k2"}, key="k2", after=["kb"]),
    )
    assert not isinstance(first, Exception), first
    assert isinstance(second, InvalidJob), second
    assert "'kb', which waits for 'k1', which waits for 'ka', which waits for 'k2'" in str(second)
    assert waited, "the second transaction did not wait for the first"
    assert sorted(Job.objects.values_list("key", flat=True)) == ["k1", "ka", "kb"]


# ---- a cycle written before enqueues refused them ------------------------------------


@pytest.fixture
def old_cycle(monkeypatch):
    """kx dead, ky after it, kx again after ky: as a release before the check wrote them."""
    from django_jobs.store import workflows

    _dead("kx")
    ky = enqueue(STEP, {"label": "ky"}, key="ky", after=["kx"])
    with monkeypatch.context() as before_the_fix:
        before_the_fix.setattr(workflows, "refuse_cycle", lambda *args, **kwargs: None)
        kx = enqueue(FRAGILE, {"label": "kx"}, key="kx", after=["ky"])
    letter = DeadLetter.objects.get(key="kx")
    return kx, ky, letter


def _status_text():
    from io import StringIO

    out = StringIO()
    call_command("jobs", "status", stdout=out)
    return out.getvalue()


def test_status_names_a_cycle_and_the_way_out_and_not_a_replay_that_cannot_help(old_cycle, capsys):
    import json

    kx, _ky, letter = old_cycle
    text = _status_text()
    assert "blocked in a cycle: 'kx', which waits for 'ky', which waits for 'kx'" in text, text
    assert f"jobs cancel {kx.id}" in text
    assert f"replayjobs --id {letter.id}" in text
    # The letter's key is held by a live job: replaying it is refused, so not advised.
    assert "dead-lettered parent" not in text, text
    call_command("jobs", "status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["cycles"] == [
        {"job": str(kx.id), "keys": ["kx", "ky"], "letters": [str(letter.id)]}
    ]
    assert report["dead_parents"] is None
    # The advice works: cancel, replay, and both run.
    call_command("jobs", "cancel", str(kx.id))
    Audit.objects.create(label="bbheal|kx")
    call_command("replayjobs", "--id", str(letter.id))
    call_command("runjobs", "--burst")
    assert not Job.objects.exists()
    assert set(CompletionMarker.objects.values_list("key", flat=True)) == {"kx", "ky"}
    assert _status_text().count("cycle") == 0


def test_a_replay_that_would_close_the_cycle_again_is_refused(old_cycle):
    from io import StringIO

    kx, ky, _letter = old_cycle
    call_command("jobs", "cancel", str(kx.id))  # its letter keeps its edge on ky
    before = _state()
    out = StringIO()
    call_command("replayjobs", "--id", str(kx.id), stdout=out)
    assert "1 that would close a cycle" in out.getvalue(), out.getvalue()
    assert f"not replayed (it would wait for jobs that wait for it: a cycle): {kx.id}" in (
        out.getvalue()
    )
    assert _state() == before
    assert DeadLetter.objects.get(id=kx.id).replayed_at is None
    assert Job.objects.get(id=ky.id).waiting_for == 1
