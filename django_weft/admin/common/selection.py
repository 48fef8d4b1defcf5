"""Admin actions that ask for confirmation, for the rows ticked on the changelist or for
**every row its filter and search match**, as the run and schedule actions work.

What is shared (the confirmation page is :mod:`.confirmation`; the actions live in
:mod:`..runs.actions` and :mod:`..schedules.actions`):

- :class:`ConfirmedActionsAdmin`, a ``ModelAdmin`` that refuses with 403 a POST naming one
  of its guarded actions from a user it does not offer that action to, and dispatches the
  "apply to all" box (``_weft_all_matching``) or Django's ``select_across``: the action
  gets the changelist's own queryset, rebuilt from the query string by the same
  :class:`~django.contrib.admin.views.main.ChangeList`, so the same filters and search apply;
- the names the confirmation pages post back (:data:`ALL_MATCHING`, :data:`AS_OF`,
  :data:`RETURN_TO`) and the helpers that read them;
- :func:`describe_filters`, the filter and search in words, for the confirmation page.

The list itself only shows rows: a GET of it reads ``WEFT_READ_DATABASE`` (:mod:`.reads`);
its actions are POSTs, which read and change the primary database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from .outages import answering_outages
from .reads import show_only

ALL_MATCHING = "_weft_all_matching"
"""POSTed as ``1``: act on every row the changelist's query string matches."""
AS_OF = "_weft_as_of"
"""When the all-matching confirmation was shown: rows created later are left alone."""
RETURN_TO = "_weft_return"
"""Where to go once done (an object's page, for its buttons); a local path only."""


def describe_filters(changelist: ChangeList) -> str:
    """The changelist's filters and search in words ("status: waiting; search “order-7”"),
    or "" when it lists every row."""
    parts: list[str] = []
    claimed: set[str] = set()
    for spec in changelist.filter_specs:
        expected = {str(name) for name in spec.expected_parameters() or () if name}
        claimed |= expected
        if not expected & set(changelist.filter_params):
            continue
        chosen = [str(choice["display"]) for choice in spec.choices(changelist) if choice.get("selected")]
        if not chosen:  # a value none of the filter's choices offers: say it as given
            chosen = [
                str(value) for name in sorted(expected) for value in changelist.filter_params.get(name, ())
            ]
        parts.append(f"{spec.title}: {', '.join(chosen)}")
    # Lookups in the address that no filter claims (``?workflow_id=order-7``) narrow the list too.
    for key, values in changelist.get_filters_params().items():
        if key not in claimed:
            parts.append(f"{key} = {', '.join(str(value) for value in values)}")
    if changelist.query:
        parts.append(f"search “{changelist.query}”")
    return "; ".join(parts)


def list_query(request: HttpRequest) -> str:
    """The changelist's query string (filters, search, ordering) without the page number."""
    query = request.GET.copy()
    for key in (PAGE_VAR, ERROR_FLAG):
        query.pop(key, None)
    return query.urlencode()


def parse_as_of(value: str | None) -> datetime | None:
    """The confirmation page's time stamp; ``ValueError`` for anything but an aware ISO time."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    if timezone.is_naive(moment):
        raise ValueError("a time stamp without a time zone")
    return moment


def return_to(request: HttpRequest) -> str | None:
    """The local path a confirmation returns to (:data:`RETURN_TO`), if it is one."""
    url = request.POST.get(RETURN_TO) or ""
    if url.startswith("/") and url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return url
    return None


def wants_all_matching(request: HttpRequest) -> bool:
    """The "apply to all" box, or Django's own ``select_across``; both mean every row the
    query string matches."""
    return request.POST.get(ALL_MATCHING) == "1" or bool(
        forms.BooleanField(required=False).to_python(request.POST.get("select_across"))
    )


def holds_nul(params: QueryDict) -> bool:
    """Whether a key or a value of ``params`` holds a NUL character."""
    return any("\x00" in key or any("\x00" in value for value in values) for key, values in params.lists())


def chosen_action(request: HttpRequest) -> str:
    """The action a changelist POST names, picked as Django picks it (``index`` says which
    of the page's action bars was used)."""
    names = request.POST.getlist("action")
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    return names[index] if 0 <= index < len(names) else ""


class ConfirmedActionsAdmin(admin.ModelAdmin):
    """A changelist whose actions may apply to every row the filter matches, with
    permission-guarded actions refused with 403 when forged; every view of it, the
    subclass's own too, answers the database's absence with a 503 page (``outages``)."""

    guarded_actions: ClassVar[frozenset[str]] = frozenset()
    """Actions a POST may name only when :meth:`get_actions` offers them to the user."""
    all_matching_needs_filter: ClassVar[bool] = True
    """Refuse "apply to all" on an unfiltered list (a table of millions of runs); a
    short table (schedules) may allow it."""

    @property
    def urls(self) -> list[URLPattern]:
        # The property the admin site reads, over the subclass's get_urls: its extra
        # views (tools, dashboard, backfill) are guarded as well as Django's.
        site = self.admin_site
        return answering_outages(self.get_urls(), str(site.site_header), str(site.site_title))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if holds_nul(request.GET):
            # No database column holds a NUL: PostgreSQL would refuse the query (a 500).
            self.message_user(request, "The address holds a NUL character; it was ignored.", messages.ERROR)
            return HttpResponseRedirect(request.path)
        show_only(request)
        if request.method == "POST" and "_save" not in request.POST:
            chosen = chosen_action(request)
            if chosen in self.guarded_actions and chosen not in self.get_actions(request):
                # Django would ignore it (or say "no action selected"); a forged POST of a
                # guarded action gets a plain refusal.
                raise PermissionDenied
            if chosen and wants_all_matching(request):
                return self._act_on_all_matching(request)
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if isinstance(response, TemplateResponse) and context and isinstance(context.get("cl"), ChangeList):
            context["weft_filter_words"] = describe_filters(context["cl"])
        return response

    def _act_on_all_matching(self, request: HttpRequest) -> HttpResponse:
        # Django hands an action to response_action only when rows are ticked; acting on
        # every row the filter matches needs none, so it is dispatched here.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            self.message_user(request, "The list's filter is not valid; nothing was changed.", messages.ERROR)
            return HttpResponseRedirect(request.path)
        words = describe_filters(changelist)
        if not words and self.all_matching_needs_filter:
            self.message_user(
                request,
                "“Apply to all matching” needs a filter or a search first; nothing was changed.",
                messages.WARNING,
            )
            return HttpResponseRedirect(request.get_full_path())
        data: QueryDict = request.POST.copy()
        data["select_across"] = "1"
        data[ALL_MATCHING] = "1"
        data._mutable = False
        request.POST = data  # type: ignore[assignment]
        request.weft_filter_words = words  # type: ignore[attr-defined]
        response = self.response_action(request, changelist.get_queryset(request))
        return response or HttpResponseRedirect(request.get_full_path())

    def invalid_selection(self, request: HttpRequest, values: list[str]) -> str | None:
        """A message when ticked values cannot be ids of this model (then nothing changes)."""
        return None

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        if not wants_all_matching(request):
            problem = self.invalid_selection(request, request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
            if problem:
                self.message_user(request, problem, messages.ERROR)
                return None
        return super().response_action(request, queryset, *args, **kwargs)


__all__ = [
    "ALL_MATCHING",
    "AS_OF",
    "RETURN_TO",
    "ConfirmedActionsAdmin",
    "chosen_action",
    "describe_filters",
    "list_query",
    "parse_as_of",
    "return_to",
    "wants_all_matching",
]
