# Schedules (docs/api.md, "Schedules"): the schedule and schedule_fire tables, and the job's
# schedule_id and scheduled_for. Both columns are nullable, so adding them rewrites nothing. The
# job index is partial (a job no schedule made never enters it) and, on PostgreSQL, built
# CONCURRENTLY, as 0018's: `job` takes every claim and report.

import django.db.models.deletion
import django.db.models.functions.datetime
import uuid
from django.db import migrations, models


INDEX = models.Index(condition=models.Q(('schedule_id__isnull', False)),
                     fields=['schedule_id', 'status'], name='job_schedule_idx')


def add_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS "job_schedule_idx" '
            'ON "job" ("schedule_id", "status") WHERE "schedule_id" IS NOT NULL')
    else:
        schema_editor.add_index(model, INDEX)


def remove_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('jobqueue', '0019_job_debounce_until'),
    ]

    operations = [
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('cron', models.CharField(max_length=100)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('job', models.JSONField(blank=True, default=dict)),
                ('overlap', models.CharField(choices=[('skip', 'skip'), ('buffer_one', 'buffer_one'), ('allow', 'allow')], default='skip', max_length=16)),
                ('catchup_window_seconds', models.PositiveIntegerField(default=60)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('next_fire_at', models.DateTimeField(blank=True, null=True)),
                ('last_fire_at', models.DateTimeField(blank=True, null=True)),
                ('last_job_id', models.UUIDField(blank=True, null=True)),
                ('fired', models.PositiveBigIntegerField(default=0)),
                ('skipped', models.PositiveBigIntegerField(default=0)),
                ('missed', models.PositiveBigIntegerField(default=0)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'schedule',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='ScheduleFire',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('fire_time', models.DateTimeField()),
                ('trigger', models.BooleanField(default=False)),
                ('outcome', models.CharField(choices=[('fired', 'fired'), ('skipped', 'skipped'), ('missed', 'missed')], max_length=16)),
                ('job_id', models.UUIDField(blank=True, null=True)),
                ('detail', models.CharField(blank=True, default='', max_length=200)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
            ],
            options={
                'db_table': 'schedule_fire',
                'ordering': ['-fire_time', '-id'],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='schedule_id',
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='scheduled_for',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='job', index=INDEX)],
            database_operations=[migrations.RunPython(add_index, remove_index)],
        ),
        migrations.AddField(
            model_name='schedule',
            name='job_agent',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='schedules', to='jobqueue.jobagent'),
        ),
        migrations.AddField(
            model_name='schedule',
            name='workspace',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='schedules', to='jobqueue.workspace'),
        ),
        migrations.AddField(
            model_name='schedulefire',
            name='schedule',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='fires', to='jobqueue.schedule'),
        ),
        migrations.AddIndex(
            model_name='schedule',
            index=models.Index(fields=['workspace', '-created_at'], name='schedule_workspace_idx'),
        ),
        migrations.AddIndex(
            model_name='schedule',
            index=models.Index(condition=models.Q(('paused_at__isnull', True)), fields=['next_fire_at'], name='schedule_due_idx'),
        ),
        migrations.AddConstraint(
            model_name='schedule',
            constraint=models.UniqueConstraint(fields=('workspace', 'name'), name='schedule_name_unique'),
        ),
        migrations.AddConstraint(
            model_name='schedule',
            constraint=models.CheckConstraint(condition=models.Q(('overlap__in', ['skip', 'buffer_one', 'allow'])), name='schedule_overlap_valid'),
        ),
        migrations.AddConstraint(
            model_name='schedulefire',
            constraint=models.UniqueConstraint(condition=models.Q(('trigger', False)), fields=('schedule', 'fire_time'), name='schedule_fire_once'),
        ),
    ]
