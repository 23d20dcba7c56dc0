from django.contrib import admin

from shop.models import Charge, Email, Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Editable, so that an operator can fix an order and replay its dead-lettered job."""

    list_display = ["pk", "item", "email", "created_at"]


admin.site.register([Email, Charge])
