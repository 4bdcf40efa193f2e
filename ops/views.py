"""Operational endpoints: /metrics (Prometheus) and /healthz (is the database reachable?).

Neither needs a session or a credential; expose them to your monitoring network only.
/healthz says "ok" or "unavailable" and nothing else: no versions, no hosts, no errors.
"""

import logging

from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

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
        return JsonResponse({"status": "unavailable"}, status=503)
    return JsonResponse({"status": "ok"})
