"""The URLs of ``benchmarks/api.py``: the REST API alone, where a project would mount it."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [path("api/weft/", include("django_weft.api.urls"))]
