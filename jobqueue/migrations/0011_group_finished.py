# group.finished: when the group watcher saw a group finish, and the deliveries it writes.

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

LIVE = ["pending", "queued", "in_progress"]


def mark_finished_groups(apps, schema_editor):
    """Groups that are finished already are marked so, without a group.finished delivery:
    the event is for groups that finish from now on."""
    JobGroup = apps.get_model("jobqueue", "JobGroup")
    Job = apps.get_model("jobqueue", "Job")
    live = Job.objects.filter(workspace_id=OuterRef("workspace_id"), group=OuterRef("name"),
                              status__in=LIVE)
    JobGroup.objects.filter(~Exists(live)).update(finished_at=Now())


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0010_groups_and_claims'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobgroup',
            name='finished_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='group',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='webhook_deliveries', to='jobqueue.jobgroup'),
        ),
        migrations.AddIndex(
            model_name='jobgroup',
            index=models.Index(condition=models.Q(('finished_at__isnull', True)), fields=['id'], name='job_group_live_idx'),
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('group__isnull', False)), fields=['group'], name='webhook_delivery_group_idx'),
        ),
        migrations.RunPython(mark_finished_groups, migrations.RunPython.noop),
    ]
