"""``path("", include("django_weft.metrics.urls"))`` serves ``/metrics`` (Prometheus's
default path), for projects that do not export prometheus_client's registry already
(``django-prometheus`` does). See docs/how-to/observe.md."""

from __future__ import annotations

from django.urls import path

from .views import metrics_view

app_name = "django_weft_metrics"

urlpatterns = [path("metrics", metrics_view, name="metrics")]
