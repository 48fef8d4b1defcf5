from __future__ import annotations

from django.urls import include, path

urlpatterns = [path("", include("django_weft.metrics.urls"))]
