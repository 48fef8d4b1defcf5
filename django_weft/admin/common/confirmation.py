"""The one confirmation flow of the admin's actions (the run lifecycle actions and the
schedule actions), on the model of Django's ``delete_selected``.

Choosing an action on the changelist shows a confirmation page listing the rows it will
reach and which of them it will skip as things stand (and why); nothing changes until it
is confirmed (``post=yes``). Then the area's runtime call applies it, one message says
what happened, and the page returns where it came from. The same page serves the rows
ticked, every row the filter and search match (:mod:`.selection`), and the buttons on an
object's page (which post one row, and :data:`~.selection.RETURN_TO`).

An action is described as data (:class:`ConfirmedAction`: its operation, title, options
form, permission) and made an admin action by :func:`confirmed_action`; what differs
between runs and schedules (how ticked values are read, how rows are counted and listed,
how the operation is applied) is a :class:`ConfirmationFlow` subclass of a few methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone

from .selection import ALL_MATCHING, AS_OF, RETURN_TO, list_query, parse_as_of, return_to
from .urls import admin_url

BAD_TIME_STAMP = "The confirmation's time stamp is not valid; nothing was changed. Choose the action again."


@dataclass(frozen=True)
class ConfirmedAction:
    """One action that asks for confirmation, as the admin offers it."""

    name: str
    """The admin action's name (the ``action`` POSTed)."""
    operation: str
    """The runtime's name of the operation it applies (``cancel``, ``pause``...)."""
    label: str
    """The verb on buttons: "Cancel"."""
    done: str
    """The verb in outcome messages and the admin history: "cancelled"."""
    explanation: str
    """What the operation does and which rows it skips, for the confirmation page."""
    what: str = ""
    """What it acts on, in the plural, for the page's title: "workflow runs"."""
    permission: str = ""
    """The model admin's ``has_<permission>_permission`` that offers the action."""
    options: type[forms.Form] | None = None
    """The form of the confirmation's options (a reason, a note, an overlap), if any."""

    def title(self) -> str:
        return f"{self.label} {self.what}"


@dataclass(frozen=True)
class Found:
    """The rows a confirmation page reaches: how many, the ids it posts back (none when
    it acts on every row matching), and the rows already read to list them."""

    count: int
    selected_ids: list[Any]
    listed: list[Any]


@dataclass(frozen=True)
class Applied:
    """What applying an action did, as the changelist says it."""

    message: str
    level: int
    returns: bool = True
    """Go back to :data:`~.selection.RETURN_TO` (``False``: the object it names is gone)."""


class ConfirmationFlow:
    """The confirmation page and the confirmed request of one action on one model admin.
    Subclasses say how ticked values are read, how the rows are found and listed, and how
    the operation applies."""

    template: ClassVar[str]
    noun: ClassVar[str]
    """One row in words: "run", "schedule"."""
    unfiltered_words: ClassVar[str] = ""
    """The filter in words when the list has none (acting on every row)."""

    def __init__(self, model_admin: admin.ModelAdmin[Any], request: HttpRequest, action: Any) -> None:
        self.model_admin = model_admin
        self.request = request
        self.action = action

    def respond(self, queryset: QuerySet[Any]) -> HttpResponse | None:
        """Show the confirmation page, or, once confirmed (``post=yes``), apply the action
        and report. ``None`` sends Django's changelist back to the list it came from."""
        request, model_admin, action = self.request, self.model_admin, self.action
        all_matching = request.POST.get(ALL_MATCHING) == "1"
        ids = [] if all_matching else self.selected_ids()
        rows = queryset if all_matching else model_admin.get_queryset(request).filter(pk__in=ids)
        confirmed = request.POST.get("post") == "yes"
        options = action.options(request.POST if confirmed else None) if action.options is not None else None
        if not confirmed or (options is not None and not options.is_valid()):
            return self.page(rows, ids, all_matching, options)
        chosen: dict[str, Any] = options.cleaned_data if options is not None else {}
        if all_matching:
            try:
                as_of = parse_as_of(request.POST.get(AS_OF))
            except ValueError:
                model_admin.message_user(request, BAD_TIME_STAMP, messages.ERROR)
                return None
            if as_of is not None:
                rows = rows.filter(created_at__lte=as_of)
        applied = self.apply(rows, ids, all_matching, chosen)
        model_admin.message_user(request, applied.message, applied.level)
        back = return_to(request) if applied.returns else None
        return HttpResponseRedirect(back) if back else None

    def page(
        self, rows: QuerySet[Any], ids: list[Any], all_matching: bool, options: forms.Form | None
    ) -> HttpResponse | None:
        """The confirmation page: what the action will reach, and Yes or No."""
        request, model_admin = self.request, self.model_admin
        as_of = timezone.now()
        if all_matching:
            # The confirmed request acts on the rows created up to now, the ones counted here.
            rows = rows.filter(created_at__lte=as_of)
        found = self.find(rows, all_matching)
        if not found.count:
            text = (
                f"No {self.noun} matches the current filter; nothing was changed."
                if all_matching
                else f"The selected {self.noun}s no longer exist; nothing was changed."
            )
            model_admin.message_user(request, text, messages.WARNING)
            return None
        table = self.table(rows, found)
        opts = model_admin.opts
        site = model_admin.admin_site
        changelist = admin_url(model_admin.model, "changelist", site=site.name)
        query = list_query(request)
        back = return_to(request)
        context = {
            **site.each_context(request),
            "title": f"{self.action.title()}?",
            "opts": opts,
            "app_label": opts.app_label,
            "media": model_admin.media + (options.media if options is not None else forms.Media()),
            "weft_action": self.action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "all_matching": all_matching,
            "all_matching_var": ALL_MATCHING,
            "as_of_var": AS_OF,
            "as_of": as_of.isoformat(),
            "return_var": RETURN_TO,
            "return_to": back,
            "count": found.count,
            "plural": found.count != 1,
            "missing": len(ids) - found.count if not all_matching else 0,
            "rows": table,
            "more": found.count - len(table),
            "skipped_shown": sum(1 for row in table if row["refusal"]),
            "selected_ids": found.selected_ids,
            "filter_words": getattr(request, "weft_filter_words", "") or self.unfiltered_words,
            "options_form": options,
            "form_url": f"{changelist}?{query}" if query else changelist,
            "back_url": back or (f"{changelist}?{query}" if query else changelist),
            "changelist_url": changelist,
        }
        request.current_app = site.name
        return TemplateResponse(request, self.template, context)

    # -- what subclasses say ----------------------------------------------------------------

    def selected_ids(self) -> list[Any]:
        """The ticked ids, once each, in order (values that cannot be one are dropped: the
        changelist refuses them first, see ``invalid_selection``)."""
        raise NotImplementedError

    def find(self, rows: QuerySet[Any], all_matching: bool) -> Found:
        """The rows the page reaches (``rows`` is what is left of the selection or filter)."""
        raise NotImplementedError

    def table(self, rows: QuerySet[Any], found: Found) -> list[dict[str, Any]]:
        """The rows listed on the page, each with its ``refusal`` (why it will be skipped)."""
        raise NotImplementedError

    def apply(
        self, rows: QuerySet[Any], ids: list[Any], all_matching: bool, chosen: dict[str, Any]
    ) -> Applied:
        """Apply the confirmed action (to ``rows`` when ``all_matching``, else to ``ids``),
        record it in the admin's history, and say what happened."""
        raise NotImplementedError


def ticked(request: HttpRequest, parse: Callable[[str], Any]) -> list[Any]:
    """The ticked values ``parse`` makes an id of, once each, in order."""
    ids: dict[Any, None] = {}
    for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        parsed = parse(value)
        if parsed is not None:
            ids[parsed] = None
    return list(ids)


def confirmed_action(
    action: ConfirmedAction, description: str, flow: type[ConfirmationFlow]
) -> Callable[[Any, HttpRequest, QuerySet[Any]], HttpResponse | None]:
    """``action`` as a Django admin action (named ``action.name``, offered with
    ``action.permission``) that goes through ``flow``."""

    def respond(model_admin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return flow(model_admin, request, action).respond(queryset)

    respond.__name__ = respond.__qualname__ = action.name
    return admin.action(description=description, permissions=[action.permission])(respond)


__all__ = [
    "Applied",
    "ConfirmationFlow",
    "ConfirmedAction",
    "Found",
    "confirmed_action",
    "ticked",
]
