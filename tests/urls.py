from django.contrib import admin
from django.urls import path

from django_jobs.metrics import metrics_view
from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order, name="create-order"),
    path("metrics/jobs", metrics_view, name="jobs-metrics"),
]
