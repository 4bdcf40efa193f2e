# The latest claim's lease and holder on the job (jobqueue/timeline.py, claimed_event): with
# the columns the claim writes anyway they are its `claimed` event, which claims no longer
# store (#26: a job's WAL). Both nullable, NULL for every job claimed before (whose events are
# stored), no default, no CHECK and no index: adding them rewrites and scans nothing.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0021_job_dependencies"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="claim_lease_seconds",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="claim_holder",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True),
        ),
    ]
