from django.apps import AppConfig
from django.db.models.signals import post_migrate


def install_statement_functions(using="default", plan=None, **kwargs):
    """After every `migrate` on PostgreSQL: the hot statements' PL/pgSQL wrappers of this
    release's texts (jobqueue/lifecycle/pg/functions.py), those missing or out of date. Not
    after a `flush` (no plan: it keeps functions), nor below the migration that installs
    them (a `migrate` back past it)."""
    from django.db import connections

    connection = connections[using]
    if plan is None or connection.vendor != "postgresql":
        return
    from django.db.migrations.recorder import MigrationRecorder

    applied = MigrationRecorder(connection).applied_migrations()
    if not any(app == "jobqueue" and name.endswith("_pgbouncer_statement_functions")
               for app, name in applied):
        return
    from jobqueue.lifecycle.pg import functions

    functions.install(connection)


class JobQueueConfig(AppConfig):
    name = "jobqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        post_migrate.connect(install_statement_functions, sender=self,
                             dispatch_uid="jobqueue.install_statement_functions")

        from django.core import checks

        from jobqueue import fencing

        checks.register(fencing.check_keys)
