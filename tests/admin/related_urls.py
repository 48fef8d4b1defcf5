"""The test URLs plus the related-runs test admin site at ``related-admin/``."""

from __future__ import annotations

from django.urls import path

from tests.urls import urlpatterns as base

from .related_site import site

urlpatterns = [*base, path("related-admin/", site.urls)]
