"""The test project as an ASGI application (the real-server test runs it under uvicorn)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

application = get_asgi_application()
