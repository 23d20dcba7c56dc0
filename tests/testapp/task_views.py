"""Views that enqueue Django Tasks (Django >= 6.0 only; tests/urls.py includes them there)."""

from django.db import transaction
from django.http import HttpResponse, JsonResponse

from tests.testapp import tasks
from tests.testapp.models import Order


def order_with_task(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.POST.get("item", "book"))
        result = tasks.record.enqueue(f"order-{order.pk}")
        if request.POST.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
    return HttpResponse(result.id)


async def async_enqueue(request):
    result = await tasks.add.aenqueue(20, 22)
    fetched = await tasks.add.aget_result(result.id)
    return JsonResponse({"id": result.id, "status": fetched.status, "args": fetched.args})
