"""The schedule admin's actions: pause, unpause, trigger and delete schedules.

They work as the run actions do, through the one confirmation flow
(:mod:`..common.confirmation`): choosing one on the changelist shows a
confirmation page listing the schedules, and which of them will be skipped and why;
nothing changes until it is confirmed. Then :func:`django_weft.runtime.apply_schedule_bulk`
passes each schedule to its runtime call (``pause_schedule``, ``unpause_schedule``,
``trigger_schedule``, ``delete_schedule``), each in its own transaction, and says which it
skipped and why; one message says what happened to each, and every schedule changed gets a
``LogEntry`` in the admin's history.

The same confirmation serves the rows ticked, **every schedule the filter and search
match** (the "apply to all" box; on this short table an unfiltered list may be chosen
too: "pause every schedule" is an operator's move), and the buttons on a schedule's page.

Permissions: ``pause_schedule`` for pause and unpause, ``trigger_schedule`` for trigger
(the REST API's), ``delete_schedule`` for delete; an action is offered only with its
permission, and a POST naming it without the permission is refused with 403.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import date_format

from ... import runtime
from ...models import Schedule
from ...models.schedules import SCHEDULE_ID_MAX_LENGTH
from ...runtime.schedule_bulk import NO_SUCH_SCHEDULE
from ...runtime.schedules import SCHEDULE_ID
from ..common.confirmation import Applied, ConfirmationFlow, ConfirmedAction, Found, confirmed_action, ticked
from ..common.display import listed, shorten
from .forms import PauseForm, TriggerForm

SCHEDULES_SHOWN = 100
"""Schedules listed on a confirmation page; the rest are counted."""
LABELS_SHOWN = 10
"""Schedules named per outcome in a message."""
CONFIRM_TEMPLATE = "admin/django_weft/schedule/confirm_action.html"

ScheduleAction = ConfirmedAction
"""One schedule action as the admin offers it (``operation``: the
:func:`~django_weft.runtime.apply_schedule_bulk` operation)."""

PAUSE = ScheduleAction(
    "pause_schedules",
    "pause",
    "Pause",
    "paused",
    "A paused schedule does not fire until it is unpaused: the times that pass meanwhile are "
    "dropped, not counted as missed. The note (optional) replaces each schedule's note and is "
    "shown on the list. Schedules already paused are skipped. A trigger or backfill still works.",
    what="schedules",
    permission="pause",
    options=PauseForm,
)
UNPAUSE = ScheduleAction(
    "unpause_schedules",
    "unpause",
    "Unpause",
    "unpaused",
    "An unpaused schedule fires again from its spec's next time after now; the times that "
    "passed while it was paused are not made up (a backfill does that). Its pause note is "
    "cleared. Schedules that are not paused are skipped.",
    what="schedules",
    permission="pause",
)
TRIGGER = ScheduleAction(
    "trigger_schedules",
    "trigger",
    "Trigger",
    "triggered",
    "Each schedule fires now, as if now (to the second) were one of its times, paused or not: "
    "a run starts under the overlap policy, so with its previous run still open a skip policy "
    "records a skip and a buffer policy waits. The fire is recorded in its recent actions; "
    "its next scheduled fire does not move.",
    what="schedules",
    permission="trigger",
    options=TriggerForm,
)
DELETE = ScheduleAction(
    "delete_schedules",
    "delete",
    "Delete",
    "deleted",
    "A deleted schedule fires no more; the runs it started are kept. Schedules declared in "
    "code are skipped: remove the declaration and run manage.py weft_schedules sync --prune.",
    what="schedules",
    permission="delete",
)
ACTIONS_BY_NAME: dict[str, ScheduleAction] = {a.name: a for a in (PAUSE, UNPAUSE, TRIGGER, DELETE)}


class ScheduleConfirmation(ConfirmationFlow):
    """A schedule action's confirmation: the schedules it reaches, applied through
    :func:`django_weft.runtime.apply_schedule_bulk`."""

    template = CONFIRM_TEMPLATE
    noun = "schedule"
    # On this short table an unfiltered list may be chosen: "pause every schedule".
    unfiltered_words = "every schedule"

    def selected_ids(self) -> list[str]:
        return ticked(self.request, lambda value: value if is_schedule_id(value) else None)

    def find(self, rows: QuerySet[Schedule], all_matching: bool) -> Found:
        shown = (
            list(rows.order_by("pk")[: SCHEDULES_SHOWN + 1]) if all_matching else list(rows.order_by("pk"))
        )
        count = rows.count() if all_matching and len(shown) > SCHEDULES_SHOWN else len(shown)
        return Found(count, [] if all_matching else [schedule.pk for schedule in shown], shown)

    def table(self, rows: QuerySet[Schedule], found: Found) -> list[dict[str, Any]]:
        return [
            {
                "schedule": schedule,
                "state": state_words(schedule),
                "refusal": runtime.schedule_refusal_for(self.action.operation, schedule),
            }
            for schedule in found.listed[:SCHEDULES_SHOWN]
        ]

    def apply(
        self, rows: QuerySet[Schedule], ids: list[Any], all_matching: bool, chosen: dict[str, Any]
    ) -> Applied:
        action = self.action
        outcome = runtime.apply_schedule_bulk(
            action.operation,
            list(rows.order_by("pk")),
            note=chosen.get("note") or "",
            overlap=chosen.get("overlap") or None,
        )
        if not all_matching:
            found = (
                {schedule.pk for schedule in outcome.changed}
                | {sid for group in outcome.skipped.values() for sid in group}
                | {sid for sid, _ in outcome.failed}
            )
            for missing in ids:
                if missing not in found:
                    outcome.skip(missing, NO_SUCH_SCHEDULE)
        log_changes(self.request, action, outcome, chosen)
        text, level = outcome_message(action, outcome)
        # The deleted schedule's page is gone: back to the list.
        return Applied(text, level, returns=not (action is DELETE and outcome.changed))


pause_schedules = confirmed_action(PAUSE, "Pause selected schedules", ScheduleConfirmation)
unpause_schedules = confirmed_action(UNPAUSE, "Unpause selected schedules", ScheduleConfirmation)
trigger_schedules = confirmed_action(TRIGGER, "Trigger selected schedules now", ScheduleConfirmation)
delete_schedules = confirmed_action(DELETE, "Delete selected schedules", ScheduleConfirmation)

SCHEDULE_ACTIONS = (pause_schedules, unpause_schedules, trigger_schedules, delete_schedules)
"""The ``actions`` of the schedule admin (Django's ``delete_selected`` is replaced by
``delete_schedules``, which goes through the runtime and explains the schedules it skips)."""

FIRE_WORDS = {
    "started": "started run {workflow_id}",
    "already_started": "its run {workflow_id} existed already",
    "skipped": "skipped ({detail})",
    "buffered": "buffered ({detail})",
    "error": "the start was refused ({detail})",
}


def fire_words(fire: dict[str, Any]) -> str:
    """A trigger's recorded action in words: "started run nightly-2027-01-01T09:00:00Z"."""
    template = FIRE_WORDS.get(str(fire.get("outcome")), "{outcome}")
    return template.format(
        workflow_id=fire.get("workflow_id") or fire.get("run_id") or "",
        detail=shorten(str(fire.get("detail") or "")),
        outcome=fire.get("outcome"),
    )


def outcome_message(action: ScheduleAction, outcome: runtime.ScheduleBulkOutcome) -> tuple[str, int]:
    """The message after an action, and its level: a success when every schedule changed,
    a warning when some were skipped (or a trigger did not start a run), an error when some
    failed."""
    changed = len(outcome.changed)
    parts: list[str] = []
    if outcome.fires:
        shown = "; ".join(
            f"{sid}: {fire_words(fire)}" for sid, fire in list(outcome.fires.items())[:LABELS_SHOWN]
        )
        rest = len(outcome.fires) - LABELS_SHOWN
        parts.append(f"Triggered {_schedules(changed)}: {shown}{f'; and {rest} more' if rest > 0 else ''}.")
    elif changed:
        parts.append(
            f"{action.done.capitalize()} {_schedules(changed)}: "
            f"{listed((s.pk for s in outcome.changed), LABELS_SHOWN)}."
        )
    else:
        parts.append(f"No schedule was {action.done}.")
    if outcome.skipped:
        count = sum(len(group) for group in outcome.skipped.values())
        groups = "; ".join(
            f"{reason}: {listed(ids, LABELS_SHOWN)}" for reason, ids in outcome.skipped.items()
        )
        parts.append(f"Skipped {count}: {groups}.")
    if outcome.failed:
        shown = "; ".join(f"{sid} ({shorten(error)})" for sid, error in outcome.failed[:LABELS_SHOWN])
        parts.append(f"Failed {len(outcome.failed)}: {shown}. The django_weft log has the details.")
    not_started = any(fire.get("outcome") != "started" for fire in outcome.fires.values())
    errors = outcome.failed or any(fire.get("outcome") == "error" for fire in outcome.fires.values())
    level = (
        messages.ERROR if errors else messages.WARNING if outcome.skipped or not_started else messages.SUCCESS
    )
    return " ".join(parts), level


def _schedules(count: int) -> str:
    return f"{count} schedule" if count == 1 else f"{count} schedules"


def history_message(
    action: ScheduleAction, schedule_id: str, outcome: runtime.ScheduleBulkOutcome, chosen: dict[str, Any]
) -> str:
    """The ``LogEntry`` message of one changed schedule."""
    if action is PAUSE and chosen.get("note"):
        return f"Paused (note: {chosen['note']})"
    if action is TRIGGER:
        fire = outcome.fires.get(schedule_id, {})
        forced = f" with overlap {chosen['overlap']}" if chosen.get("overlap") else ""
        return f"Triggered{forced}: {fire_words(fire)}"
    return action.done.capitalize()


def log_changes(
    request: HttpRequest, action: ScheduleAction, outcome: runtime.ScheduleBulkOutcome, chosen: dict[str, Any]
) -> None:
    """One admin ``LogEntry`` per changed schedule (a deletion for delete)."""
    flag = DELETION if action is DELETE else CHANGE
    by_message: dict[str, list[Schedule]] = {}
    for schedule in outcome.changed:
        by_message.setdefault(history_message(action, schedule.pk, outcome, chosen), []).append(schedule)
    for message, schedules in by_message.items():
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type]  # a staff user, never anonymous
            queryset=schedules,
            action_flag=flag,
            change_message=message,
        )


def state_words(schedule: Schedule) -> str:
    """The schedule's state for the confirmation's list: "next fire 2027-01-01 09:00:00"."""
    if schedule.paused:
        return f"paused ({schedule.note})" if schedule.note else "paused"
    if schedule.next_fire_at is None:
        return "ended"
    return f"next fire {date_format(timezone.localtime(schedule.next_fire_at), 'Y-m-d H:i:s')}"


def is_schedule_id(value: str) -> bool:
    return len(value) <= SCHEDULE_ID_MAX_LENGTH and bool(SCHEDULE_ID.fullmatch(value))


__all__ = [
    "DELETE",
    "PAUSE",
    "SCHEDULE_ACTIONS",
    "TRIGGER",
    "UNPAUSE",
    "ScheduleAction",
    "ScheduleConfirmation",
    "is_schedule_id",
    "outcome_message",
]
