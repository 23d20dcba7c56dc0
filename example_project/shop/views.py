from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from django_jobs import enqueue_on_commit
from shop import jobs, tasks
from shop.models import Order

FORM = """<!doctype html><title>django-jobs shop</title>
<h1>Place an order</h1>
<form method="post" action="/orders/">
  <input name="email" value="ada@example.com"> <input name="item" value="book">
  <button>Order</button>
</form>
<p>Try the item <code>discontinued-widget</code> to see a dead letter.
<p><a href="/admin/django_jobs/">Jobs in the admin</a>"""


def order_form(request):
    return HttpResponse(FORM)


@require_POST
def place_order(request):
    # The order and its jobs commit together: if anything below raises, there
    # is no order and no job. No worker can see the jobs before the commit.
    with transaction.atomic():
        order = Order.objects.create(email=request.POST["email"], item=request.POST["item"])
        enqueue_on_commit(jobs.send_confirmation, {"order_id": order.pk})
        enqueue_on_commit(
            jobs.charge_card, {"order_id": order.pk, "amount": 1999}, key=f"charge-{order.pk}"
        )
        enqueue_on_commit(jobs.reserve_stock, {"order_id": order.pk})
        # A Django @task: enqueue() joins this transaction too.
        tasks.thank_customer.enqueue(order.pk)
        if request.POST.get("explode"):
            raise RuntimeError("the view failed after enqueueing: everything rolls back")
    return redirect("/admin/django_jobs/")
