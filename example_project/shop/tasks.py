"""One task written against Django's own Tasks API (django.tasks), run by the same worker.

settings.TASKS makes django_jobs.backend.JobsBackend its backend, so
``thank_customer.enqueue()`` writes a job in the view's transaction (no
transaction.on_commit needed), ``runjobs`` runs it next to the handlers of
jobs.py, and ``thank_customer.get_result(id)`` reads its result back.
"""

from django.tasks import task

from shop.models import Order


@task(priority=-10)
def thank_customer(order_id):
    order = Order.objects.get(pk=order_id)
    return f"Thank you for ordering a {order.item}, {order.email}!"
