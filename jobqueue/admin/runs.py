"""The maintenance record, read-only: the reaper's (one row per `reap_claims` run or admin
reap-now) and the other services' (maintenance_run)."""

from django.contrib import admin

from jobqueue.models import MaintenanceRun, ReaperRun

from .common import OfferedFiltersOnly


def run_duration(run: ReaperRun) -> str:
    return "—" if run.duration_seconds is None else f"{run.duration_seconds:.3f} s"


class RunAdmin(OfferedFiltersOnly):
    """A record of runs: read-only, with the duration and whether it failed."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="duration", ordering="duration_seconds")
    def duration(self, obj):
        return run_duration(obj)

    @admin.display(description="error", boolean=True)
    def has_error(self, obj):
        return bool(obj.error)


@admin.register(ReaperRun)
class ReaperRunAdmin(RunAdmin):
    list_display = [
        "id",
        "started_at",
        "finished_at",
        "sweeps",
        "duration",
        "batches",
        "requeued",
        "expired",
        "dry_run",
        "host",
        "pid",
        "has_error",
    ]
    list_filter = ["dry_run"]
    readonly_fields = [
        "id",
        "started_at",
        "finished_at",
        "duration_seconds",
        "sweeps",
        "batches",
        "requeued",
        "expired",
        "dry_run",
        "error",
        "host",
        "pid",
    ]
    fields = readonly_fields


@admin.register(MaintenanceRun)
class MaintenanceRunAdmin(RunAdmin):
    """Runs of the other maintenance services (the pruner, ...), read-only."""

    list_display = ["id", "service", "started_at", "finished_at", "runs", "duration", "counts",
                    "dry_run", "host", "pid", "has_error"]
    list_filter = ["service", "dry_run"]
    readonly_fields = ["id", "service", "started_at", "finished_at", "duration_seconds", "runs",
                       "counts", "dry_run", "error", "host", "pid"]
    fields = readonly_fields
