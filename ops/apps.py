from django.apps import AppConfig


class OpsConfig(AppConfig):
    """/healthz, /metrics and the request timer: they watch the core, the core never sees them."""

    name = "ops"
    verbose_name = "Operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from jobqueue import observe

        from . import metrics

        observe.subscribe(metrics.on_event)
