"""What a user's type checker sees of the public API (checked by mypy, never run).

`python3 dev.py typecheck` checks this file with the package: each assert_type
pins a type that users rely on, and each `# type: ignore[...]` a mistake that
must stay an error (warn_unused_ignores fails the run once it is accepted).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypedDict, assert_type

from django_jobs import (
    Backoff,
    EnqueueResult,
    JobContext,
    OnParentDead,
    cancel_workflow,
    enqueue,
    enqueue_many,
    enqueue_on_commit,
    job,
    periodic,
    workflow,
)
from django_jobs.registry import Handler


class Order(TypedDict):
    order_id: int


@job
def charge(payload: Order, ctx: JobContext) -> str:
    return ctx.key


@periodic(every=60)
@job(queue="mail", max_attempts=3, backoff=Backoff.exponential(), timeout=30.0)
def send_digest(payload: dict[str, int], ctx: JobContext) -> None:
    ctx.extend_lease(10.0)


@job
async def fetch(payload: int, ctx: JobContext) -> bytes:
    return b""


@job
def untyped(payload, ctx):  # type: ignore[no-untyped-def]  # what an unannotated handler gives
    return None


def check() -> None:
    assert_type(charge, Handler[Order, str])
    assert_type(send_digest, Handler[dict[str, int], None])
    assert_type(untyped, Handler[Any, Any])
    assert_type(charge({"order_id": 1}), str)
    assert_type(charge.enqueue({"order_id": 1}, delay=timedelta(minutes=5)), EnqueueResult)
    assert_type(charge.enqueue_on_commit({"order_id": 1}, commit_of="other"), EnqueueResult)
    assert_type(enqueue(charge, {"order_id": 1}, key="order-1"), EnqueueResult)
    assert_type(enqueue_on_commit("shop.charge", None), EnqueueResult)
    assert_type(enqueue_many(send_digest, [{"a": 1}]), list[EnqueueResult])
    result = charge.enqueue({"order_id": 1})
    assert_type(result.id.hex, str)
    assert_type(result.duplicate, bool | None)

    assert_type(enqueue(charge, {"order_id": 1}, after=[result, "key"]), EnqueueResult)
    assert_type(
        charge.enqueue({"order_id": 1}, after=[result.id], on_parent_dead="dead"), EnqueueResult
    )
    with workflow(name="order-1") as w:
        first = w.enqueue(charge, {"order_id": 1}, key="charge-1")
        assert_type(
            w.enqueue("shop.ship", None, after=[first], on_parent_dead=OnParentDead.DEAD),
            EnqueueResult,
        )
    assert_type(w.results, list[EnqueueResult])
    assert_type(cancel_workflow("order-1").cancelled, int)

    charge.enqueue({"order": 1})  # type: ignore[arg-type]
    charge.enqueue({"order_id": 1}, dely=3)  # type: ignore[call-arg]
    fetch.enqueue("1")  # type: ignore[arg-type]
    job(queue=5)  # type: ignore[call-overload]
