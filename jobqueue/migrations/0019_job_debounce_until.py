# The debounce cap stored on the job (docs/api.md "Unique jobs and debounce"): set by the
# create that made a debounced job with debounce_max_seconds, read by every later push. The
# column is nullable and NULL for every job but those, so adding it rewrites nothing, and it
# has no index (read only on the row a keyed create already found).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0018_job_unique_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="debounce_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
