"""The worker table: each worker process advertises, with its heartbeat, the workflows
and activity queues it has registered. A new table: processes of the previous version
keep running (they only do not advertise themselves)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_weft', '0018_step_epoch'),
    ]

    operations = [
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('engine_id', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('weft_worker', 'weft_worker'), ('celery', 'Celery worker')], max_length=16)),
                ('hostname', models.CharField(blank=True, default='', max_length=255)),
                ('pid', models.PositiveIntegerField(default=0)),
                ('workflows', models.JSONField(default=list)),
                ('activity_queues', models.JSONField(default=list)),
                ('started_at', models.DateTimeField()),
                ('heartbeat_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'worker',
                'verbose_name_plural': 'workers',
                'indexes': [models.Index(fields=['heartbeat_at'], name='weft_worker_heartbeat')],
            },
        ),
    ]
