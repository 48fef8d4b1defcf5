"""The REST API of django_weft (Django REST framework): mount ``django_weft.api.urls``.

Needs the ``api`` extra: ``pip install 'django-weft[api]'`` (djangorestframework,
django-filter, drf-spectacular and its sidecar), and ``rest_framework`` and
``drf_spectacular_sidecar`` in ``INSTALLED_APPS``.
"""
