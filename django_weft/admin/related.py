"""The runs of one of the project's own objects on that object's admin page.

Runs have no foreign key to the project's models (an ``InlineModelAdmin`` needs one), so a
run belongs to an object through a key the project chose when it started the run: its
workflow id (``order-42``) or a search attribute (``order_id=42``).
:func:`related_runs` makes a read-only field that lists them::

    from django_weft.admin import related_runs

    @admin.register(Order)
    class OrderAdmin(admin.ModelAdmin):
        readonly_fields = ("workflow_runs",)
        workflow_runs = related_runs(workflow_id="order-{pk}")

Both keys are indexed: a workflow id is an equality on ``(workflow_id, created_at)``, a
search attribute a JSON containment on the GIN index (PostgreSQL). Reads only, from
``WEFT_READ_DATABASE`` (the field only shows runs: a run started a moment ago may not be
listed yet when the replica lags).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from django.db.models import Model, QuerySet
from django.templatetags.static import static
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import runtime
from ..engine.search_attributes import NAME_RULE, is_attribute_name
from ..models import WorkflowRun
from .common.display import moment, status_badge
from .common.urls import admin_url

DEFAULT_LIMIT = 20
STYLESHEET = "django_weft/admin.css"
SHOWN_COLUMNS = ("id", "workflow_id", "workflow_name", "status", "created_at", "finished_at")


class RelatedRuns:
    """A read-only admin field listing the workflow runs of the object on the page,
    newest first, at most ``limit`` of them, with a link to the changelist of all of them.

    Made by :func:`related_runs`; usable by name (a class attribute of the ``ModelAdmin``
    named in ``readonly_fields`` or ``fieldsets``) or directly in ``readonly_fields``.
    It reads at most two queries per page (the runs, and their count when there are more
    than ``limit``) and shows no payloads: status, workflow, workflow id and times.
    """

    def __init__(
        self,
        *,
        workflow_id: str | Callable[[Any], str | Iterable[str]] | None,
        search_attribute: str | None,
        value: Callable[[Any], Any] | None,
        limit: int,
        description: str,
        admin_site: str,
    ) -> None:
        self.workflow_id = workflow_id
        self.search_attribute = search_attribute
        self.value = value
        self.limit = limit
        self.short_description = description
        self.admin_site = admin_site
        self.__name__ = "related_runs"  # what Django's admin names a callable field by

    def __repr__(self) -> str:
        if self.search_attribute is not None:
            return f"related_runs(search_attribute={self.search_attribute!r})"
        return f"related_runs(workflow_id={self.workflow_id!r})"

    # -- the key ------------------------------------------------------------------------

    def workflow_ids(self, obj: Model) -> list[str]:
        """The workflow ids of ``obj``'s runs (keyed on workflow ids only)."""
        if self.workflow_id is None:
            return []
        if isinstance(self.workflow_id, str):
            return [self.workflow_id.format_map(_Attributes(obj))]
        found = self.workflow_id(obj)
        return [found] if isinstance(found, str) else [str(each) for each in found]

    def attribute_value(self, obj: Model) -> Any:
        """The search attribute's value for ``obj`` (keyed on a search attribute only):
        ``value(obj)``, else its primary key (a number as a number, anything else as text,
        as JSON holds it)."""
        if self.value is not None:
            return self.value(obj)
        pk = obj.pk
        return pk if isinstance(pk, int) and not isinstance(pk, bool) else str(pk)

    def runs(self, obj: Model) -> QuerySet[WorkflowRun]:
        """``obj``'s runs, newest first (all of them: slice it)."""
        runs = runtime.run_queryset(may_lag=True)
        if self.search_attribute is not None:
            found = runs.search(**{self.search_attribute: self.attribute_value(obj)})
        else:
            ids = self.workflow_ids(obj)
            found = runs.filter(workflow_id=ids[0]) if len(ids) == 1 else runs.filter(workflow_id__in=ids)
        return found.order_by("-created_at", "-id")

    def changelist_url(self, obj: Model) -> str | None:
        """The run changelist showing all of ``obj``'s runs: the search box's
        ``attr=value`` or workflow id as typed, else the ``workflow_id`` lookup; ``None``
        when no changelist URL can say it (a value with a space, a JSON object or list; an
        id with a comma among several)."""
        changelist = admin_url(WorkflowRun, "changelist", site=self.admin_site)
        if self.search_attribute is not None:
            value = self.attribute_value(obj)
            if isinstance(value, dict | list):
                return None
            text = value if isinstance(value, str) else json.dumps(value)
            if not text or any(char.isspace() for char in text):
                return None
            return f"{changelist}?{urlencode({'q': f'{self.search_attribute}={text}'})}"
        ids = self.workflow_ids(obj)
        if len(ids) == 1:
            wanted = {"q": ids[0]} if _searchable(ids[0]) else {"workflow_id": ids[0]}
            return f"{changelist}?{urlencode(wanted)}"
        if any("," in each for each in ids):
            return None
        # Several search terms must all match; the ``__in`` lookup takes any of them.
        return f"{changelist}?{urlencode({'workflow_id__in': ','.join(ids)})}"

    # -- the field ----------------------------------------------------------------------

    def __call__(self, obj: Model | None) -> SafeString | str:
        if obj is None or obj.pk is None:
            return "none yet (the object is not saved)"
        runs = list(self.runs(obj).only(*SHOWN_COLUMNS)[: self.limit + 1])
        if not runs:
            return "none"
        shown = runs[: self.limit]
        rows = format_html_join(
            "\n",
            '<tr data-run="{}"><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    run.pk,
                    status_badge(run.status),
                    admin_url(WorkflowRun, "change", run.pk, site=self.admin_site),
                    run.workflow_id,
                    run.workflow_name,
                    moment(run.created_at),
                    moment(run.finished_at) if run.finished_at is not None else "",
                )
                for run in shown
            ),
        )
        url = self.changelist_url(obj)
        if len(runs) > self.limit:
            total = self.runs(obj).count()
            everything = (
                format_html('<a href="{}">all {} runs</a>', url, total) if url else f"{total} runs in all"
            )
            footer = format_html(
                '<p class="weft-related-more">The newest {} shown; {}.</p>', self.limit, everything
            )
        elif url:
            footer = format_html('<p class="weft-related-more"><a href="{}">In the run list</a></p>', url)
        else:
            footer = SafeString("")
        # The stylesheet with the fragment: the project's page does not load it (a
        # stylesheet link in the body is valid HTML, and a repeated one is fetched once).
        return format_html(
            '<link rel="stylesheet" href="{}"><table class="weft-related-runs"><thead><tr><th>status</th>'
            "<th>workflow id</th><th>workflow</th><th>created</th><th>finished</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            static(STYLESHEET),
            rows,
            footer,
        )


def related_runs(
    *,
    workflow_id: str | Callable[[Any], str | Iterable[str]] | None = None,
    search_attribute: str | None = None,
    value: Callable[[Any], Any] | None = None,
    limit: int = DEFAULT_LIMIT,
    description: str = "workflow runs",
    admin_site: str = "admin",
) -> RelatedRuns:
    """A read-only admin field listing an object's workflow runs, keyed on one of:

    - ``workflow_id``: the runs' workflow id, as a template formatted with the object's
      attributes (``"order-{pk}"``, ``"invoice-{number}"``) or a callable taking the object
      and returning one id or several;
    - ``search_attribute``: the name of a search attribute the runs were started with,
      equal to ``value(obj)`` (default: the object's primary key; a number stays a number).

    ``limit`` caps the runs listed (newest first; a link leads to all of them in the run
    changelist); ``description`` is the field's label; ``admin_site`` the URL namespace of
    the admin site showing runs. Raises ``ValueError`` for a missing or doubled key or a
    search attribute name the run search cannot take.

    The field shows the runs to whoever can see the object's page; the links lead to run
    pages that need ``view_workflowrun``.
    """
    if (workflow_id is None) == (search_attribute is None):
        raise ValueError("related_runs() takes either workflow_id= or search_attribute=, not both or neither")
    if search_attribute is not None and not is_attribute_name(search_attribute):
        raise ValueError(f"{search_attribute!r} is not a search attribute name: {NAME_RULE}")
    if value is not None and search_attribute is None:
        raise ValueError("value= goes with search_attribute=; a workflow_id callable computes the id itself")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    return RelatedRuns(
        workflow_id=workflow_id,
        search_attribute=search_attribute,
        value=value,
        limit=limit,
        description=description,
        admin_site=admin_site,
    )


class _Attributes(Mapping[str, Any]):
    """An object's attributes as a mapping, for ``str.format_map``."""

    def __init__(self, obj: Model) -> None:
        self.obj = obj

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self.obj, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def _searchable(workflow_id: str) -> bool:
    """Whether the search box finds this workflow id as typed (no space, no ``=``)."""
    return bool(workflow_id) and "=" not in workflow_id and not any(char.isspace() for char in workflow_id)
