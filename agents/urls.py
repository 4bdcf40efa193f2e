"""/v1/ routes. Ids in paths match anything up to the next slash, so that a malformed id is
answered by the view (a JSON 404), not by the resolver."""

from django.urls import path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import batch_views, views


class AnyId:
    regex = "[^/]+"

    def to_python(self, value):
        return value

    def to_url(self, value):
        return str(value)


register_converter(AnyId, "anyid")

W = "workspaces/<anyid:workspace_id>/"
A = W + "job-agents/<anyid:agent_id>/"
J = W + "jobs/<anyid:job_id>/"

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # agent
    path(A + "jobs", views.AgentJobsView.as_view(), name="agent-jobs"),
    path(A + "jobs/claim", views.ClaimNextView.as_view(), name="agent-claim-next"),
    path(A + "jobs/<anyid:job_id>/claim", views.ClaimJobView.as_view(), name="agent-claim"),
    path(A + "heartbeat", batch_views.BatchHeartbeatView.as_view(), name="agent-heartbeat"),
    path(A + "reports", batch_views.BatchReportView.as_view(), name="agent-reports"),
    path(J + "heartbeat", views.HeartbeatView.as_view(), name="job-heartbeat"),
    path(J + "status", views.StatusView.as_view(), name="job-status"),
    path(J + "release", views.ReleaseView.as_view(), name="job-release"),
    # producer and operator
    path(W + "jobs", views.JobsView.as_view(), name="jobs"),
    path(W + "jobs/<anyid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path(J + "cancel", views.CancelView.as_view(), name="job-cancel"),
    path(J + "requeue", views.RequeueView.as_view(), name="job-requeue"),
    path(J + "dispatch", views.DispatchView.as_view(), name="job-dispatch"),
    path(W + "job-agents", views.JobAgentsView.as_view(), name="job-agents"),
    path(W + "job-agents/<anyid:agent_id>", views.JobAgentDetailView.as_view(),
         name="job-agent-detail"),
    path(A + "tokens", views.TokensView.as_view(), name="agent-tokens"),
    path(A + "tokens/<anyid:token_id>", views.TokenDetailView.as_view(), name="agent-token"),
]
