"""Operational endpoints: /metrics (Prometheus), /healthz (is the database reachable?) and
the landing page at / and /v1/ (links to the API docs, the schema and the admin).

None needs a session or a credential; expose /metrics to your monitoring network only.
/healthz says "ok" or "unavailable" and the server's version, nothing else: no hosts, no
errors.
"""

import logging

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

import jobqueue
from jobqueue.lifecycle.backends import backend

from . import metrics

# The logger keeps the name it had when this module lived in the core (log routing).
log = logging.getLogger("jobqueue.health")


@never_cache
@require_GET
def metrics_view(request):
    body, content_type = metrics.render()
    return HttpResponse(body, content_type=content_type)


@never_cache
@require_GET
def healthz(request):
    try:
        backend().ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
        log.warning("healthz: database unreachable (%s)", type(exc).__name__)
        return JsonResponse({"status": "unavailable", "version": jobqueue.__version__},
                            status=503)
    return JsonResponse({"status": "ok", "version": jobqueue.__version__})


@require_GET
def landing(request):
    """/ and /v1/: what is served here, with links (the admin's "View site" comes here)."""
    return render(request, "landing.html", {"version": jobqueue.__version__})
