from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"
