"""Times every request for /metrics (jobqueue_http_request_duration_seconds)."""

from __future__ import annotations

import time

from .metrics import REQUEST_LATENCY

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetricsMiddleware:
    """Times every request. The route label is the URL pattern, never the raw path."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = (match.route or match.view_name) if match is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        REQUEST_LATENCY.labels(method, route, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response
