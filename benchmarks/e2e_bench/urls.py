"""The admin and the REST API, for ``benchmarks/parked.py``'s page timings."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("api/weft/", include("django_weft.api.urls"))]
