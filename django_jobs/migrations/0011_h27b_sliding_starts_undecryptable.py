# Sliding rate windows: the log of starts (docs/flow-control.md); dead reason undecryptable.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0010_tags_and_meta"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deadletter",
            name="reason",
            field=models.CharField(
                choices=[
                    ("invalid_payload", "invalid payload"),
                    ("unknown_name", "unknown name"),
                    ("attempts_exhausted", "attempts exhausted"),
                    ("fatal", "fatal error"),
                    ("cancelled", "cancelled"),
                    ("parent_dead", "parent dead"),
                    ("malformed", "malformed row"),
                    ("undecryptable", "undecryptable payload"),
                ],
                max_length=32,
            ),
        ),
        migrations.CreateModel(
            name="FlowStart",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(help_text="The limited group.", max_length=210)),
                ("partition", models.CharField(blank=True, default="", max_length=200)),
                ("started_at", models.DateTimeField()),
                ("starts", models.IntegerField()),
            ],
            options={
                "db_table": "django_jobs_flow_start",
                "indexes": [
                    models.Index(fields=["key", "started_at"], name="django_jobs_flow_start_at")
                ],
            },
        ),
    ]
