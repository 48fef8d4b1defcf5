from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/weft/", include("django_weft.api.urls")),
    path("async/greet/", views.greet),
]
