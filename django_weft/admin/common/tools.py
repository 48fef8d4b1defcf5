"""The base of the admin's tool pages: a page with a form, behind a permission checked on
every request, GET and POST alike, whose outcome shows under the form. The run tools
(:mod:`..runs.tools`, :mod:`..runs.reset`) and the schedules' Backfill
(:mod:`..schedules.backfill`) build on :class:`ToolView`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.helpers import AdminForm
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Model
from django.http import HttpRequest, HttpResponseBase
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString
from django.views import View

from ...engine.errors import WeftError
from .forms import as_sentence
from .urls import admin_url

TEMPLATE = "admin/django_weft/workflowrun/tool_form.html"


def non_atomic_view(
    model_admin: admin.ModelAdmin[Any], cls: type[ToolView]
) -> Callable[..., HttpResponseBase]:
    """``cls`` as an admin view of ``model_admin``, exempt from ``ATOMIC_REQUESTS`` on
    every database: the runtime commits what it stores before it waits (an update's
    result), and a wait must hold no transaction."""
    wrapped: Callable[..., HttpResponseBase] = model_admin.admin_site.admin_view(
        cls.as_view(model_admin=model_admin)
    )
    for alias in settings.DATABASES:
        wrapped = transaction.non_atomic_requests(using=alias)(wrapped)
    return wrapped


@dataclass(frozen=True)
class Outcome:
    """What a tool shows after it ran: a result, or a failure that is not the form's."""

    title: str
    summary: str
    value: SafeString | None = None
    failed: bool = False


class ToolView(View):
    """A tool's page: permission, form, rendering. Subclasses say what is sent."""

    model_admin: admin.ModelAdmin[Any] | None = None
    tool: ClassVar[str]
    title: ClassVar[str]
    submit_label: ClassVar[str]
    form_class: ClassVar[type[forms.Form]]
    template_name: ClassVar[str] = TEMPLATE
    back_label: ClassVar[str] = "Back to the run"
    http_method_names = ["get", "head", "post"]

    @property
    def admin(self) -> admin.ModelAdmin[Any]:
        assert self.model_admin is not None, "as_view(model_admin=...) sets it"
        return self.model_admin

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # Checked on every request, GET and POST alike.
        if not self.may_use(request):
            raise PermissionDenied(self.denied_message())
        return super().dispatch(request, *args, **kwargs)

    def may_use(self, request: HttpRequest) -> bool:
        """Whether the request's user may use this tool."""
        raise NotImplementedError

    def denied_message(self) -> str:
        """Why a user who may not use the tool is refused (403)."""
        raise NotImplementedError

    def render(
        self,
        request: HttpRequest,
        form: forms.Form,
        *,
        obj: Model | None = None,
        outcome: Outcome | None = None,
        closed: str | None = None,
        known_names: Sequence[str] = (),
    ) -> TemplateResponse:
        if known_names and "name" in form.fields:
            form.fields["name"].widget.attrs["list"] = "weft-known-names"
        opts = self.admin.opts
        site = self.admin.admin_site
        request.current_app = site.name
        context = {
            **site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "title": self.title,
            "subtitle": str(obj) if obj is not None else None,
            "original": obj,
            # AdminForm renders any form as the admin's fieldsets (the stubs say ModelForm).
            "adminform": AdminForm(
                cast(Any, form), [(None, {"fields": list(form.fields)})], {}, model_admin=self.admin
            ),
            "media": self.admin.media + form.media,
            "has_view_permission": self.admin.has_view_permission(request, obj),
            "weft_tool": self.tool,
            "weft_submit": self.submit_label,
            "weft_outcome": outcome,
            "weft_closed": closed,
            "weft_known_names": list(known_names),
            "weft_back_label": self.back_label,
        }
        return TemplateResponse(request, self.template_name, context)

    def url(self, view: str, *args: Any) -> str:
        """The URL of one of the model admin's views (``changelist``, ``change``...) on this site."""
        return admin_url(self.admin.model, view, *args, site=self.admin.admin_site.name)

    @staticmethod
    def add_error(form: forms.Form, exc: WeftError, field: str | None = None) -> None:
        """The runtime's refusal on the form: on ``field``, or on the form as a whole."""
        form.add_error(field if field in form.fields else None, as_sentence(exc.message))


__all__ = ["TEMPLATE", "Outcome", "ToolView", "non_atomic_view"]
