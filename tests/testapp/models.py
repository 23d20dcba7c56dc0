from django.db import models


class Audit(models.Model):
    """One row per effect of a handler: counting them tells how often it ran."""

    label = models.CharField(max_length=200)
    job_id = models.UUIDField(null=True)
    attempt = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)


class Order(models.Model):
    item = models.CharField(max_length=100)
