"""The admin with Django's test client: users with and without the run permissions, and
runs written straight into the tables (the admin only reads them)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_weft.models import Step, WorkflowRun

PASSWORD = "correct horse battery staple"
CHANGELIST = "admin:django_weft_workflowrun_changelist"


def make_user(
    username: str, *, staff: bool = True, superuser: bool = False, permissions: tuple[str, ...] = ()
) -> Any:
    model = get_user_model()
    if superuser:
        user = model.objects.create_superuser(username, password=PASSWORD)
    else:
        user = model.objects.create_user(username, password=PASSWORD, is_staff=staff)
    if permissions:
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="django_weft", codename__in=permissions)
        )
    return user


def logged_in(username: str, **kwargs: Any) -> Client:
    make_user(username, **kwargs)
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


@pytest.fixture
def admin_client_(db: None) -> Client:
    """A superuser's client (pytest-django's ``admin_client`` uses another password)."""
    return logged_in("root", superuser=True)


def changelist_url() -> str:
    return reverse(CHANGELIST)


def change_url(run: WorkflowRun) -> str:
    return reverse("admin:django_weft_workflowrun_change", args=[run.pk])


def make_run(
    workflow_id: str,
    *,
    status: str = "completed",
    workflow: str = "tests.echo",
    created_at: datetime | None = None,
    **fields: Any,
) -> WorkflowRun:
    run = WorkflowRun.objects.create(
        id=fields.pop("id", uuid.uuid4()),
        workflow_id=workflow_id,
        workflow_name=workflow,
        status=status,
        **fields,
    )
    if created_at is not None:
        WorkflowRun.objects.filter(pk=run.pk).update(created_at=created_at)
        run.refresh_from_db()
    return run


def make_step(run: WorkflowRun, seq: int, kind: str, name: str, status: str, **fields: Any) -> Step:
    fields.setdefault("started_at", run.created_at)
    return Step.objects.create(run=run, seq=seq, kind=kind, name=name, status=status, **fields)
