from django.urls import path

from . import views

urlpatterns = [
    path("", views.landing, name="landing"),
    path("metrics", views.metrics_view, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
]
