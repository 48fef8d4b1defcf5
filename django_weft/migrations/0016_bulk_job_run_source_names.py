"""A bulk job names its run source in the runtime's registry, not by an import string:
the two sources django_weft stored by path are rewritten to their names."""

from django.db import migrations, models, router

RENAMED = {
    "django_weft.api.bulk.runs_of_job": "runs_list",
    "django_weft.runtime.bulk_jobs.runs_by_lookups": "lookups",
}
"""Stored import string -> run source name. A path of a project's own function is left
as it was: the project registers its function under that path as the name."""


def _rename(apps, schema_editor, renames):
    model = apps.get_model("django_weft", "BulkJob")
    alias = schema_editor.connection.alias
    if not router.allow_migrate_model(alias, model):
        return  # django_weft's tables live in another database
    jobs = model._default_manager.using(alias)
    for old, new in renames.items():
        jobs.filter(runs_from=old).update(runs_from=new)


def to_names(apps, schema_editor):
    _rename(apps, schema_editor, RENAMED)


def to_paths(apps, schema_editor):
    _rename(apps, schema_editor, {new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):

    dependencies = [
        ('django_weft', '0015_run_reset_links'),
    ]

    operations = [
        migrations.AlterField(
            model_name='bulkjob',
            name='runs_from',
            field=models.CharField(help_text='Name of the run source (django_weft.runtime.run_sources) that reads the filter.', max_length=200),
        ),
        migrations.RunPython(to_names, to_paths),
    ]
