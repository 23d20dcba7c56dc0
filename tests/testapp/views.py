from django.db import transaction
from django.http import HttpResponse

from django_jobs import enqueue_on_commit
from tests.testapp.jobs import record, record_where
from tests.testapp.models import Order


def create_order(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.POST.get("item", "book"))
        enqueue_on_commit(record, {"label": f"order-{order.pk}"})
        if request.POST.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return HttpResponse(str(order.pk))


def create_order_on(request, alias):
    """Write an order on database `alias` and enqueue its job in the same transaction."""
    with transaction.atomic(using=alias):
        order = Order.objects.using(alias).create(item=request.POST.get("item", "book"))
        enqueue_on_commit(record_where, {"label": f"order-{order.pk}"})
        if request.POST.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return HttpResponse(str(order.pk))
