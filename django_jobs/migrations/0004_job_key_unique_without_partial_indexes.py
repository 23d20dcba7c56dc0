"""MariaDB and MySQL: a plain unique index on the job's key, for the partial one they lack.

Neither has partial indexes, so Django does not create the conditional
UniqueConstraint django_jobs_job_key_unique there (models.W036), and one key could
then be held by two live jobs. A plain unique index on the nullable key is the same
rule on these databases: NULL (a job without a key) never collides with NULL.
PostgreSQL and SQLite keep their partial index; this migration does nothing there.
MariaDB's claim and lease indexes need nothing: Django makes them without their
condition (models.W037), and they still serve the claim.
"""

from django.db import migrations

INDEX = "django_jobs_job_key_plain"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"CREATE UNIQUE INDEX {quote(INDEX)} ON {quote('django_jobs_job')} ({quote('key')})"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    quote = schema_editor.quote_name
    schema_editor.execute(f"DROP INDEX {quote(INDEX)} ON {quote('django_jobs_job')}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0003_flow_control"),
    ]

    operations = [
        # DDL: MySQL commits it at once, and Django refuses it inside a transaction there.
        migrations.RunPython(create, drop, atomic=False),
    ]
