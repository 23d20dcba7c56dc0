from django.db import transaction
from django.http import HttpResponse

from django_jobs import enqueue_on_commit
from tests.testapp.jobs import record
from tests.testapp.models import Order


def create_order(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.POST.get("item", "book"))
        enqueue_on_commit(record, {"label": f"order-{order.pk}"})
        if request.POST.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return HttpResponse(str(order.pk))
