from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", views.order_form, name="order-form"),
    path("orders/", views.place_order, name="place-order"),
]
