"""The same, pytest style: the `jobs` and `jobs_drain` fixtures come with django-jobs.

python -m pytest     # in example_project/ (pytest-django; see pytest.ini)
"""

from shop.jobs import charge_card, send_confirmation
from shop.models import Charge, Email, Order


def test_a_confirmation_is_sent_once(client, jobs):
    client.post("/orders/", {"email": "ada@example.com", "item": "book"})
    order = Order.objects.get()
    jobs.assert_enqueued(send_confirmation, {"order_id": order.pk})
    summary = jobs.drain(run_scheduled=True)
    assert len(summary.dead) == 0
    assert Email.objects.get().to == "ada@example.com"
    jobs.assert_not_enqueued()


def test_the_card_is_charged_on_the_retry(client, jobs_drain):
    client.post("/orders/", {"email": "ada@example.com", "item": "book"})
    summary = jobs_drain(run_scheduled=True)
    assert [(a.name, a.attempt) for a in summary.retried] == [(charge_card.name, 1)]
    assert Charge.objects.get().attempt == 2
