from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents and credentials"
    default_auto_field = "django.db.models.BigAutoField"
