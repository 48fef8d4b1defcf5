"""``path("api/weft/", include("django_weft.api.urls"))``: the REST API (docs/reference/rest.md).

Every view is exempt from ``ATOMIC_REQUESTS``: the runtime opens its own short
transactions, and a long poll must hold none while it waits.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from .schema import WeftRedocView, WeftSchemaView, WeftSwaggerView
from .views import RunViewSet, ScheduleViewSet, WorkflowListView

app_name = "django_weft_api"

router = SimpleRouter()
router.register("runs", RunViewSet, basename="run")
router.register("schedules", ScheduleViewSet, basename="schedule")


def _non_atomic(pattern: URLPattern | URLResolver) -> URLPattern | URLResolver:
    if isinstance(pattern, URLPattern):
        callback = pattern.callback
        for alias in settings.DATABASES:
            callback = transaction.non_atomic_requests(using=alias)(callback)
        pattern.callback = callback
    return pattern


urlpatterns = [
    _non_atomic(pattern)
    for pattern in [
        *router.urls,
        path("workflows/", WorkflowListView.as_view(), name="workflows"),
        path("schema/", WeftSchemaView.as_view(), name="schema"),
        path("schema/swagger/", WeftSwaggerView.as_view(), name="schema-swagger"),
        path("schema/redoc/", WeftRedocView.as_view(), name="schema-redoc"),
    ]
]
