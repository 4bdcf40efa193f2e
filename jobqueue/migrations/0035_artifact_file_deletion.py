# The files of pruned jobs' artifacts still to delete from the artifact storage
# (jobqueue/lifecycle/prune.py; the artifact cleaner retries what the storage refused).

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0034_sqlite_concurrency_moved_first'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArtifactFileDeletion',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('storage_key', models.CharField(db_index=True, max_length=500)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'artifact_file_deletion',
            },
        ),
    ]
