from django.contrib import admin
from django.db.models import Count

from jobqueue.models import Workspace

from .common import OfferedFiltersOnly, name_or_id_search


@admin.register(Workspace)
class WorkspaceAdmin(OfferedFiltersOnly):
    list_display = ["name", "id", "agent_count", "created_at"]
    search_fields = ["name", "=id"]
    readonly_fields = ["id", "created_at"]
    fields = ["id", "name", "created_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(agent_count=Count("job_agents"))

    @admin.display(description="job agents", ordering="agent_count")
    def agent_count(self, obj):
        return obj.agent_count

    def get_search_results(self, request, queryset, search_term):
        return name_or_id_search(queryset, search_term)
