from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0004_fewer_indexes_on_hot_paths")]

    operations = [
        migrations.AddField(
            model_name="jobagent",
            name="paused_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="jobagent",
            name="paused_by",
            field=models.CharField(blank=True, default="", editable=False, max_length=255),
        ),
    ]
