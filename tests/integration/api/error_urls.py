"""A URLconf for the error-handler tests: the service's own URLs and handlers, plus views that
raise Django's errors outside DRF (and one DRF view that crashes), under /v1/ and outside it."""

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.urls import path
from rest_framework.views import APIView

from config import urls as service

# The service's error handlers are this URLconf's (Django looks them up on the root URLconf).
for _name in ("handler400", "handler403", "handler404", "handler500"):
    if hasattr(service, _name):
        globals()[_name] = getattr(service, _name)

ERRORS = {
    "bad-request": BadRequest("a BadRequest raised by a view"),
    "suspicious": SuspiciousOperation("a SuspiciousOperation raised by a view"),
    "forbidden": PermissionDenied(),
    "crash": RuntimeError("a bug"),
}


def raising(exc):
    def view(request):
        raise exc

    return view


class CrashingApiView(APIView):
    """A DRF view whose error is no APIException: DRF hands it on to Django's handler500."""

    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request):
        raise RuntimeError("a bug in an API view")


urlpatterns = [
    *(path(f"v1/errors/{name}", raising(exc)) for name, exc in ERRORS.items()),
    *(path(f"errors/{name}", raising(exc)) for name, exc in ERRORS.items()),
    path("v1/errors/drf-crash", CrashingApiView.as_view()),
    *service.urlpatterns,
]
