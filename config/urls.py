from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("ops.urls")),
    path("v1/", include("agents.urls")),
]

# JSON errors under /v1/ for URLs that match no view (HTML elsewhere).
handler404 = "agents.exceptions.not_found_view"
handler500 = "agents.exceptions.server_error_view"
