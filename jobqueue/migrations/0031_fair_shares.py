# Fair shares (#29; docs/api.md "Fair shares"): fairness_key rows (PUT fairness-keys/{key},
# a key's weight), job.fairness_key and job.fair_at (NULL for a plain job: no bytes in its
# row, no rewrite of the table). A fair job's fair_at is its place in claim order, given when
# it is created (jobqueue/lifecycle/fairness.py); 0032 rebuilds the claim indexes on
# COALESCE(fair_at, available_at).

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0030_job_rate_limit_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="FairnessKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("key", models.CharField(max_length=255)),
                ("weight", models.PositiveSmallIntegerField(default=1)),
                ("created_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ("updated_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now())),
                ("workspace", models.ForeignKey(
                    db_index=False, on_delete=django.db.models.deletion.CASCADE,
                    related_name="+", to="jobqueue.workspace")),
            ],
            options={"db_table": "fairness_key", "ordering": ["key"]},
        ),
        migrations.AddConstraint(
            model_name="fairnesskey",
            constraint=models.UniqueConstraint(fields=("workspace", "key"),
                                               name="fairness_key_unique"),
        ),
        migrations.AddField(
            model_name="job",
            name="fairness_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="fair_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
