"""The REST API over real HTTP: pytest-django's ``live_server`` (a threaded WSGI server on
the test database) and ``requests`` with HTTP Basic authentication."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from tests.support.driver import Driver

PASSWORD = "correct horse battery staple"
WEFT_PERMISSIONS = [
    "view_workflowrun",
    "add_workflowrun",
    "signal_workflowrun",
    "update_workflowrun",
    "cancel_workflowrun",
    "suspend_workflowrun",
    "view_schedule",
    "add_schedule",
    "change_schedule",
    "delete_schedule",
    "pause_schedule",
    "trigger_schedule",
]


@dataclass
class Api:
    """A client of the API at ``base`` as one user (or anonymous with ``auth=None``)."""

    base: str
    auth: tuple[str, str] | None

    def url(self, path: str) -> str:
        return path if path.startswith("http") else self.base + path.lstrip("/")

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url(path), auth=self.auth, timeout=60, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> requests.Response:
        return requests.post(self.url(path), json=json, auth=self.auth, timeout=60, **kwargs)

    def patch(self, path: str, json: Any = None, **kwargs: Any) -> requests.Response:
        return requests.patch(self.url(path), json=json, auth=self.auth, timeout=60, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.delete(self.url(path), auth=self.auth, timeout=60, **kwargs)

    def as_user(self, username: str | None) -> Api:
        return Api(self.base, (username, PASSWORD) if username else None)


def make_user(username: str, *, staff: bool, permissions: list[str]) -> Any:
    user = get_user_model().objects.create_user(username, password=PASSWORD, is_staff=staff)
    if permissions:
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="django_weft", codename__in=permissions)
        )
    return user


@pytest.fixture
def api(live_server: Any, transactional_db: None) -> Api:
    """The API as a staff user holding every django_weft permission (runs and schedules)."""
    make_user("ops", staff=True, permissions=WEFT_PERMISSIONS)
    return Api(f"{live_server.url}/api/weft/", ("ops", PASSWORD))


@pytest.fixture
def driver() -> Iterator[Driver]:
    worker = Driver("api-driver")
    yield worker
    worker.stop()
