from django.contrib import admin
from django.urls import include, path

from ops.views import landing

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("ops.urls")),
    # The landing page (ops.views.landing) answers /v1/ too: the API's root names no resource.
    path("v1/", landing, name="api-landing"),
    path("v1/", include("agents.urls")),
]

# Errors raised outside DRF (a bad Host header, a URL that matches no view, a crash): JSON
# {"code", "detail"} under /v1/, Django's HTML pages elsewhere.
handler400 = "agents.exceptions.bad_request_view"
handler403 = "agents.exceptions.permission_denied_view"
handler404 = "agents.exceptions.not_found_view"
handler500 = "agents.exceptions.server_error_view"
