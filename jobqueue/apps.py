from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core import checks

        from jobqueue import fencing

        checks.register(fencing.check_keys)
