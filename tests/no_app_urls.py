from django.tasks import task

urlpatterns = []


@task
def send_receipt(order_id):
    return order_id
