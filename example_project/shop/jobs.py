"""The shop's background work.

One handler that succeeds, one that retries, one that fails for good.
"""

from django_jobs import FatalError, job
from shop.models import Charge, Email, Order


@job(atomic=True)
def send_confirmation(payload, ctx):
    """Atomic: the Email row and the job's completion commit together, exactly once."""
    order = Order.objects.get(pk=payload["order_id"])
    Email.objects.create(order=order, to=order.email, subject=f"Your {order.item} is on its way")


@job(max_attempts=3)
def charge_card(payload, ctx):
    """The 'payment gateway' times out on the first attempt; the retry succeeds."""
    if ctx.attempt == 1:
        raise ConnectionError("payment gateway timed out (simulated)")
    # ctx.key is what a real provider's Idempotency-Key header would get.
    Charge.objects.get_or_create(
        idempotency_key=ctx.key, defaults={"order_id": payload["order_id"], "attempt": ctx.attempt}
    )
    return {"charged": payload["amount"]}


@job
def reserve_stock(payload, ctx):
    """Fails for good on a discontinued item: fix the order in the admin, then replay the job."""
    order = Order.objects.get(pk=payload["order_id"])
    if order.item == "discontinued-widget":
        raise FatalError(
            f"{order.item} is no longer made: retrying cannot help. Change order {order.pk}'s "
            "item in the admin, then replay this dead letter"
        )
    return {"reserved": order.item}
