"""The shop's orders and their jobs, tested with Django's TestCase and django_jobs.testing.

TestCase wraps each test in a transaction that never commits: drain() still runs
the jobs, in this thread, through the worker's own claim and settle.

    python manage.py test         # or: python -m pytest
"""

from django.test import TestCase
from shop import jobs, tasks
from shop.models import Charge, Email, Order

from django_jobs.models import DeadReason
from django_jobs.testing import assert_enqueued, assert_not_enqueued, drain, perform, task_payload


class PlaceOrderTests(TestCase):
    def place_order(self, item="book", **extra):
        self.client.post("/orders/", {"email": "ada@example.com", "item": item, **extra})
        return Order.objects.get(item=item)

    def test_an_order_enqueues_its_jobs(self):
        order = self.place_order()
        assert_enqueued(jobs.send_confirmation, {"order_id": order.pk})
        assert_enqueued(
            jobs.charge_card, {"order_id": order.pk, "amount": 1999}, key=f"charge-{order.pk}"
        )
        assert_enqueued(jobs.reserve_stock, {"order_id": order.pk})
        assert_enqueued(tasks.thank_customer, task_payload(order.pk))

    def test_a_failed_order_enqueues_nothing(self):
        with self.assertRaises(RuntimeError):
            self.client.post("/orders/", {"email": "a@example.com", "item": "kite", "explode": 1})
        self.assertFalse(Order.objects.exists())
        assert_not_enqueued()

    def test_the_jobs_send_one_email_and_charge_the_card_once(self):
        order = self.place_order()
        # charge_card fails once; its retry waits for the 1 s backoff of settings.py:
        # run_scheduled=True runs it now instead.
        summary = drain(run_scheduled=True)
        self.assertEqual([a.name for a in summary.retried], ["shop.jobs.charge_card"])
        self.assertEqual(len(summary.succeeded), 4)
        self.assertEqual(Email.objects.get().order, order)
        self.assertEqual(Charge.objects.get().attempt, 2)
        assert_not_enqueued()

    def test_without_run_scheduled_the_retry_waits(self):
        order = self.place_order()
        summary = drain()
        self.assertEqual(len(summary.succeeded), 3)
        assert_enqueued(jobs.charge_card, key=f"charge-{order.pk}")
        self.assertFalse(Charge.objects.exists())

    def test_the_thank_you_task_result_reads_back(self):
        order = self.place_order(item="lamp")
        result = tasks.thank_customer.enqueue(order.pk)
        drain(tasks.thank_customer.queue_name)
        self.assertEqual(
            tasks.thank_customer.get_result(result.id).return_value,
            "Thank you for ordering a lamp, ada@example.com!",
        )

    def test_a_discontinued_item_is_dead_lettered_at_once(self):
        self.place_order(item="discontinued-widget")
        summary = drain(run_scheduled=True)
        [dead] = summary.dead
        self.assertEqual((dead.name, dead.reason), ("shop.jobs.reserve_stock", DeadReason.FATAL))
        self.assertIn("no longer made", str(dead.error))


class HandlerTests(TestCase):
    def test_charge_card_is_idempotent_across_attempts(self):
        order = Order.objects.create(email="a@example.com", item="book")
        payload = {"order_id": order.pk, "amount": 1999}
        with self.assertRaises(ConnectionError):
            perform(jobs.charge_card, payload, key="charge-1")
        self.assertEqual(
            perform(jobs.charge_card, payload, key="charge-1", attempt=2), {"charged": 1999}
        )
        perform(jobs.charge_card, payload, key="charge-1", attempt=3)
        self.assertEqual(Charge.objects.get().idempotency_key, "charge-1")
