"""What operators type into the admin, parsed: the run changelist's search box, and the
forms of the object tools (Send signal, Send update, Run query, Start workflow).

Search: ``order-42`` is a workflow id, a UUID is a run id (or a workflow id that looks
like one), ``customer=7`` matches the search attribute ``customer`` (7 the number or "7"
the string). Terms separated by spaces must all match.

Tool forms check what the runtime would refuse, field by field, with the fields of
:mod:`..common.forms`; what only the runtime can decide (a validator, an unknown handler,
a finished run, a taken workflow id) the views add to the form.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.core.validators import MaxValueValidator

from ...engine.search_attributes import NAME_RULE, is_attribute_name
from ...models.runs import WORKFLOW_ID_MAX_LENGTH
from ...runtime.operations import OPERATIONS, START_PRIORITY, WaitRule
from ..common.forms import DurationTextField, JSONTextField, TextField, workflow_choices


class SearchError(ValueError):
    """A search term that cannot match anything as typed; the message says what to fix."""


@dataclass(frozen=True)
class RunSearch:
    """A parsed changelist search: every part must match."""

    ids: tuple[str, ...] = ()
    """Terms that are a run id or a workflow id."""
    attributes: tuple[tuple[str, str], ...] = field(default=())
    """``(name, text)`` pairs, searched with ``WorkflowRunQuerySet.search_attribute``
    (the text or a JSON scalar it stands for, as the REST filter reads it)."""


def parse_run_search(term: str) -> RunSearch:
    """Split the search box's text into ids and ``attr=value`` conditions.

    Raises :class:`SearchError` for an attribute name that is not letters, digits, ``_``
    and ``-`` (starting with a letter or ``_``, no ``__``), an ``=`` with nothing before
    it, or a NUL character (no database column holds one)."""
    if "\x00" in term:
        raise SearchError("the search contains a NUL character; remove it")
    ids: list[str] = []
    attributes: list[tuple[str, str]] = []
    for part in term.split():
        if "=" not in part:
            ids.append(part)
            continue
        name, _, raw = part.partition("=")
        if not is_attribute_name(name):
            raise SearchError(f"{part!r}: a search attribute name is {NAME_RULE} (search attr=value)")
        attributes.append((name, raw))
    return RunSearch(tuple(ids), tuple(attributes))


def as_run_id(text: str) -> uuid.UUID | None:
    """``text`` as a run id, or ``None`` when it is not a UUID."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


# -- the object tools' forms ----------------------------------------------------------------

UPDATE_WAIT = OPERATIONS["update"].wait or WaitRule()
"""How long the update form waits for the handler's result: at most ``WEFT_API_MAX_WAIT``,
as the REST API (the request holds a server thread meanwhile). An update not answered by
then is accepted and stays durable."""
ON_CONFLICT_CHOICES = tuple(
    (choice.value, choice.label) for choice in OPERATIONS["start"].choices["on_conflict"]
)


class SignalForm(forms.Form):
    name = TextField(
        help_text="The signal's name, as the workflow waits for it (ctx.wait_signal) or handles it "
        "(ctx.on_signal). A signal no one waits for yet is kept until the workflow asks for it."
    )
    payload = JSONTextField(what="the payload", help_text="JSON; empty for null.")
    signal_id = TextField(
        label="Signal id",
        required=False,
        help_text="Optional. A signal with an id already accepted for this run and name is not "
        "stored twice, so sending again is safe.",
    )


class UpdateForm(forms.Form):
    name = TextField(help_text="The update handler's name (ctx.on_update).")
    payload = JSONTextField(
        what="the payload", help_text="JSON; empty for null. The handler's validator checks it first."
    )
    update_id = TextField(
        label="Update id",
        required=False,
        help_text="Optional; a new one is made when empty. Sending an id again returns the outcome "
        "of the update sent with it, without applying it twice.",
    )
    wait = forms.FloatField(label="Wait (seconds)", required=False, min_value=0, initial=UPDATE_WAIT.default)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The maximum is a setting, read live: it is the REST API's too.
        maximum = UPDATE_WAIT.surface_maximum
        wait = self.fields["wait"]
        assert isinstance(wait, forms.FloatField)
        wait.validators.append(MaxValueValidator(maximum))
        wait.widget.attrs["max"] = maximum
        wait.help_text = (
            f"How long to wait for the handler's result, up to {maximum:g} s; empty for "
            f"{UPDATE_WAIT.default:g}. An update not answered by then is kept and applied later."
        )

    def clean_wait(self) -> float:
        wait = self.cleaned_data.get("wait")
        return UPDATE_WAIT.default if wait is None else float(wait)


class QueryForm(forms.Form):
    name = TextField(help_text="The query handler's name (ctx.on_query).")
    args = JSONTextField(
        expect=list,
        empty=[],
        what="the arguments",
        help_text="A JSON list of arguments for the handler; empty for none.",
    )


class StartWorkflowForm(forms.Form):
    workflow = forms.ChoiceField(choices=workflow_choices, help_text="A workflow registered in this process.")
    args = JSONTextField(
        expect=list,
        empty=[],
        what="args",
        help_text='A JSON list of positional arguments, such as [42, "express"].',
    )
    kwargs = JSONTextField(
        expect=dict,
        empty={},
        what="kwargs",
        help_text='A JSON object of keyword arguments, such as {"order_id": 42}.',
    )
    workflow_id = TextField(
        label="Workflow id",
        required=False,
        max_length=WORKFLOW_ID_MAX_LENGTH,
        help_text="The business key, such as order-42. Empty: the new run's id.",
    )
    on_conflict = forms.ChoiceField(
        label="If the id is taken",
        choices=ON_CONFLICT_CHOICES,
        initial="fail",
        help_text="What to do when a run with this workflow id exists.",
    )
    execution_timeout = DurationTextField(
        what="the execution timeout",
        help_text='Optional: the longest the run may take, such as "7d" or 3600 (seconds).',
    )
    start_delay = DurationTextField(
        what="the start delay", help_text='Optional: start the run this much later, such as "15m".'
    )
    search_attributes = JSONTextField(
        expect=dict,
        empty={},
        what="the search attributes",
        help_text='A JSON object stored with the run for searching, such as {"customer": 7}.',
    )
    priority = forms.IntegerField(
        required=False,
        min_value=START_PRIORITY.minimum,
        max_value=START_PRIORITY.maximum,
        initial=START_PRIORITY.default,
        help_text=f"{START_PRIORITY.minimum} to {START_PRIORITY.maximum}, higher first; empty for "
        f"{START_PRIORITY.default}. It orders the run among those waiting for a worker or for a "
        "concurrency slot.",
    )

    def clean_priority(self) -> int:
        priority = self.cleaned_data.get("priority")
        return START_PRIORITY.default if priority is None else int(priority)
