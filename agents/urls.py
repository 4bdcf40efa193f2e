"""/v1/ routes: the schema, its docs, and the API's viewsets under /v1/workspaces/{id}/.

DRF's own router with the workspace as a prefix, not a nested-router package: the workspace
has no endpoint of its own to nest under, and path converters (use_regex_path=False) keep the
URL patterns what they were, `workspaces/<anyid:workspace_id>/jobs/<anyid:job_id>/heartbeat`:
/metrics labels requests by that pattern, and the schema types `anyid` as a UUID.

Ids in paths match anything up to the next slash, so that a malformed id is answered by the
view (a JSON 404), not by the resolver. No trailing slashes.
"""

from django.urls import path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from .views import (
    FairnessKeyViewSet,
    FlowViewSet,
    GroupViewSet,
    JobAgentViewSet,
    JobEffectViewSet,
    JobExplainViewSet,
    JobOutputViewSet,
    JobViewSet,
    RateLimitViewSet,
    RegisterView,
    RegistrationTokenViewSet,
    ScheduleViewSet,
    TokenViewSet,
    WebhookViewSet,
)
from .views.meta import JwksView, VersionView


class AnyId:
    regex = "[^/]+"

    def to_python(self, value):
        return value

    def to_url(self, value):
        return str(value)


register_converter(AnyId, "anyid")


class RestOfPath:
    """A rate limit's key: the rest of the path, any characters (a "/", a newline: Django's
    `path` converter stops at a newline), so that a key no job could carry is answered by the
    view (a JSON 400 naming it), not by the resolver."""

    regex = r"[\s\S]+"

    def to_python(self, value):
        return value

    def to_url(self, value):
        return str(value)


register_converter(RestOfPath, "restofpath")


class WorkspaceRouter(SimpleRouter):
    """No trailing slash, path converters; the list and detail routes take their names (what
    OPTIONS answers) from the viewset's `route_names`."""

    def __init__(self):
        super().__init__(trailing_slash=False, use_regex_path=False)

    def get_routes(self, viewset):
        names = viewset.route_names
        kinds = {"{basename}-list": "list", "{basename}-detail": "detail"}
        return [
            route._replace(initkwargs={"name": names[kinds[route.name]]})
            if route.name in kinds and kinds[route.name] in names
            else route
            for route in super().get_routes(viewset)
        ]


W = "workspaces/<anyid:workspace_id>/"
router = WorkspaceRouter()
router.register(W + "job-agents", JobAgentViewSet, basename="agent")
router.register(W + "job-agents/<anyid:agent_id>/tokens", TokenViewSet, basename="agent-token")
router.register(W + "jobs", JobViewSet, basename="job")
router.register(W + "groups", GroupViewSet, basename="group")
router.register(W + "flows", FlowViewSet, basename="flow")
router.register(W + "webhooks", WebhookViewSet, basename="webhook")
router.register(W + "schedules", ScheduleViewSet, basename="schedule")
# A key is text that may hold "/": the rest of the path (the viewsets' converter).
router.register(W + "rate-limits", RateLimitViewSet, basename="rate-limit")
router.register(W + "fairness-keys", FairnessKeyViewSet, basename="fairness-key")
router.register(W + "registration-tokens", RegistrationTokenViewSet,
                basename="registration-token")
router.register(W + "jobs/<anyid:job_id>", JobOutputViewSet, basename="job-output")
router.register(W + "jobs/<anyid:job_id>", JobEffectViewSet, basename="job-effect")
router.register(W + "jobs/<anyid:job_id>", JobExplainViewSet, basename="job-explain")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("version", VersionView.as_view(), name="api-version"),
    path(".well-known/jwks.json", JwksView.as_view(), name="api-jwks"),
    path("register", RegisterView.as_view(), name="api-register"),
    *router.urls,
]
