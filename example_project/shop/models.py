from django.db import models


class Order(models.Model):
    email = models.EmailField()
    item = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"order {self.pk}: {self.item} for {self.email}"


class Email(models.Model):
    """What the confirmation handler 'sends' (a row, so the demo needs no mail server)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="emails")
    to = models.EmailField()
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField(auto_now_add=True)


class Charge(models.Model):
    """A card charge, recorded with the idempotency key the payment provider would get."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="charges")
    idempotency_key = models.CharField(max_length=255, unique=True)
    attempt = models.IntegerField()
