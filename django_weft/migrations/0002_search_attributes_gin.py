"""A GIN index on ``WorkflowRun.search_attributes``, on PostgreSQL only.

It lives outside ``Meta.indexes`` because SQLite has no GIN; other backends skip it.
"""

from __future__ import annotations

from django.db import migrations

INDEX = "weft_run_search_attrs_gin"


def create_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        table = apps.get_model("django_weft", "WorkflowRun")._meta.db_table
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS {INDEX} ON "{table}" USING gin (search_attributes jsonb_path_ops)'
        )


def drop_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("django_weft", "0001_initial")]
    operations = [migrations.RunPython(create_index, drop_index, elidable=False)]
