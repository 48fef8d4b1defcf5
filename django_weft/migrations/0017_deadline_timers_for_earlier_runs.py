"""A deadline timer for every active run with an execution deadline and none.

Since 0006 a run's ``execution_timeout`` is enforced by a ``deadline`` timer written at
the start; before it, the deadline was only stored on the run. A run started then and
still active would never time out. This migration writes the missing timers, so the
next sweep times out a run whose deadline has passed. It only adds rows: workers of the
code before it keep running while it is applied.

Reversing it leaves the timers in place: ``deadline`` is a timer kind at every earlier
schema, and removing them would make those runs stop timing out again.
"""

from django.db import migrations, router
from django.db.models import Exists, OuterRef

ACTIVE = ["pending", "running", "waiting", "suspended"]
RUN_LEVEL_SEQ = -1
BATCH = 1000


def add_deadline_timers(apps, schema_editor):
    runs = apps.get_model("django_weft", "WorkflowRun")
    timers = apps.get_model("django_weft", "Timer")
    alias = schema_editor.connection.alias
    if not router.allow_migrate_model(alias, timers):
        return  # django_weft's tables live in another database
    has_deadline_timer = timers._default_manager.using(alias).filter(run_id=OuterRef("pk"), kind="deadline")
    missing = (
        runs._default_manager.using(alias)
        .filter(status__in=ACTIVE, execution_deadline__isnull=False)
        .exclude(Exists(has_deadline_timer))
        .values_list("pk", "execution_deadline")
    )
    batch = []
    for run_id, deadline in missing.iterator(chunk_size=BATCH):
        batch.append(timers(run_id=run_id, seq=RUN_LEVEL_SEQ, kind="deadline", fire_at=deadline))
        if len(batch) == BATCH:
            timers._default_manager.using(alias).bulk_create(batch, ignore_conflicts=True)
            batch = []
    timers._default_manager.using(alias).bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('django_weft', '0016_bulk_job_run_source_names'),
    ]

    operations = [
        migrations.RunPython(add_deadline_timers, migrations.RunPython.noop),
    ]
