from importlib.util import find_spec

from django.contrib import admin
from django.urls import path

from django_jobs.metrics import metrics_view
from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order, name="create-order"),
    path("orders/<str:alias>/", views.create_order_on, name="create-order-on"),
    path("metrics/jobs", metrics_view, name="jobs-metrics"),
]

if find_spec("django.tasks") is not None:  # Django >= 6.0
    from tests.testapp import task_views

    urlpatterns += [
        path("task-orders/", task_views.order_with_task, name="task-order"),
        path("async-enqueue/", task_views.async_enqueue, name="async-enqueue"),
    ]
