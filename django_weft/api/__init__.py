"""The REST API of django_weft (Django REST framework): mount ``django_weft.api.urls``.

Needs the ``api`` extra: ``pip install 'django-weft[api]'`` (djangorestframework,
django-filter, drf-spectacular and its sidecar), and ``rest_framework``,
``drf_spectacular`` and ``drf_spectacular_sidecar`` in ``INSTALLED_APPS`` (the system checks
``django_weft.E021`` and ``E022`` name the schema pages' two when the URLs are mounted
without them).
"""

from __future__ import annotations

from ..extras import require_extra

require_extra(
    "api", "django_weft.api", "rest_framework", "django_filters", "drf_spectacular", "drf_spectacular_sidecar"
)
