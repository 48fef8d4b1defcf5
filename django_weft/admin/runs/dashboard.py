"""The runs dashboard at ``admin/django_weft/workflowrun/dashboard/``: counts per status
and per workflow, the oldest waiting and runnable runs, expired leases, due timers, the
live workers and the runs none of them can execute, the busiest concurrency keys, the
rate limits that are behind and the busiest activity concurrency groups, runs finished
per minute over the last hour as a sparkline, and for users who may view schedules, the
schedules at a glance. Every count of runs (or schedules) links to the changelist
filtered to those it counts.

The figures come from :func:`django_weft.runtime.status_report`,
:func:`django_weft.runtime.worker_coverage`, :func:`django_weft.runtime.busiest_keys`,
:func:`django_weft.runtime.busy_rate_limits`,
:func:`django_weft.runtime.busiest_activity_groups` and
:func:`django_weft.runtime.finished_per_minute` (the figures ``weft_status`` prints);
the page reads a fixed number of queries however many runs there are, takes no query
parameters, and writes nothing. It only shows figures, so it reads them from
``WEFT_READ_DATABASE`` (:mod:`..common.reads`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.safestring import SafeString

from ... import runtime
from ...models import Schedule, WorkflowRun
from ...runtime.operations import OPERATIONS
from ..common.display import moment, status_badge
from ..common.reads import reads_may_lag, show_only
from ..common.urls import admin_url, url_name
from ..timeline import format_duration
from .changelist import queue_of
from .sparkline import render_sparkline
from .waits import describe_wait, waited_positions

TEMPLATE = "admin/django_weft/dashboard.html"
SPARKLINE_MINUTES = 60
STATUSES = tuple(str(status) for status in WorkflowRun.Status.values)
"""Every status, in the model's order (active first, then the terminal ones)."""


def dashboard_urls(model_admin: admin.ModelAdmin[WorkflowRun]) -> list[URLPattern]:
    """The dashboard's URL under the run admin's URLs, named
    ``admin:django_weft_workflowrun_dashboard``; staff only (the admin site's login)."""

    def dashboard(request: HttpRequest) -> HttpResponse:
        return dashboard_view(request, model_admin)

    name = url_name(WorkflowRun, "dashboard")
    return [path("dashboard/", model_admin.admin_site.admin_view(dashboard), name=name)]


def dashboard_view(request: HttpRequest, model_admin: admin.ModelAdmin[WorkflowRun]) -> HttpResponse:
    """The dashboard, for a staff user who may view runs (403 otherwise)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    show_only(request)
    lag = reads_may_lag(request)
    report = runtime.status_report(may_lag=lag)
    finished = runtime.finished_per_minute(SPARKLINE_MINUTES, now=report.read_at, may_lag=lag)
    changelist = admin_url(WorkflowRun, "changelist", site=model_admin.admin_site.name)
    shows_schedules = OPERATIONS["view_schedule"].allowed(request.user)
    coverage = runtime.worker_coverage(report, may_lag=lag, schedules=shows_schedules)
    schedules = None
    if shows_schedules:
        schedules = ScheduleFigures.read(coverage, admin_name=model_admin.admin_site.name, may_lag=lag)
    workers = WorkerFigures.build(coverage, changelist_url=changelist)
    keys = KeyRow.build_all(runtime.busiest_keys(now=report.read_at, may_lag=lag), changelist_url=changelist)
    rate_limits = BucketRow.build_all(runtime.busy_rate_limits(now=report.read_at, may_lag=lag))
    activity_groups = ActivityGroupRow.build_all(
        runtime.busiest_activity_groups(now=report.read_at, may_lag=lag)
    )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Workflow runs dashboard",
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        "changelist_url": changelist,
        "dashboard": Dashboard.build(
            report, finished, changelist_url=changelist, admin_name=model_admin.admin_site.name, may_lag=lag
        ),
        "schedules": schedules,
        "workers": workers,
        "concurrency_keys": keys,
        "rate_limits": rate_limits,
        "activity_groups": activity_groups,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


# -- what the template shows ------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A number and the changelist URL of the runs it counts."""

    count: int
    url: str


@dataclass(frozen=True)
class StatusFigure(Figure):
    status: str
    badge: SafeString


@dataclass(frozen=True)
class WorkflowRow:
    name: str
    total: Figure
    cells: tuple[Figure, ...]
    """One per column of :attr:`Dashboard.headers`."""


@dataclass(frozen=True)
class OldestRun:
    """A run an operator should look at first, and how long it has been so."""

    url: str
    workflow: str
    workflow_id: str
    badge: SafeString
    since: str
    age: str
    detail: str


@dataclass(frozen=True)
class Dashboard:
    read_at: str
    total: Figure
    statuses: tuple[StatusFigure, ...]
    headers: tuple[SafeString, ...]
    """The per-workflow table's status columns (the statuses that have runs)."""
    workflows: tuple[WorkflowRow, ...]
    oldest_waiting: OldestRun | None
    oldest_runnable: OldestRun | None
    expired_leases: Figure
    due_timers: Figure
    oldest_due_timer: str
    finished: Figure
    finished_peak: int
    finished_from: str
    finished_to: str
    sparkline: SafeString

    @classmethod
    def build(
        cls,
        report: runtime.StatusReport,
        finished: runtime.FinishedPerMinute,
        *,
        changelist_url: str,
        admin_name: str = "admin",
        may_lag: bool = False,
    ) -> Dashboard:
        link = _linker(changelist_url)
        now = report.read_at
        tz = timezone.get_current_timezone()
        labels = [_clock(finished.minute(index)) for index in range(len(finished.counts))]
        statuses = tuple(
            StatusFigure(
                count=report.counts.get(status, 0),
                url=link(status__exact=status),
                status=status,
                badge=status_badge(status),
            )
            for status in _statuses(report.counts)
        )
        # The table's columns: only the statuses some run is in (the tiles show them all).
        columns = tuple(status for status in _statuses(report.counts) if report.counts.get(status))
        workflows = tuple(
            WorkflowRow(
                name=name,
                total=Figure(sum(counts.values()), link(workflow=name)),
                cells=tuple(
                    Figure(counts.get(status, 0), link(workflow=name, status__exact=status))
                    for status in columns
                ),
            )
            for name, counts in report.counts_by_workflow.items()
        )
        oldest_due = report.oldest_due_timer
        return cls(
            read_at=moment(now),
            total=Figure(sum(report.counts.values()), changelist_url),
            statuses=statuses,
            headers=tuple(status_badge(status) for status in columns),
            workflows=workflows,
            oldest_waiting=_oldest(
                report.oldest_waiting,
                now,
                admin_name,
                since=lambda run: run.updated_at,
                tz=tz,
                may_lag=may_lag,
            ),
            oldest_runnable=_oldest(
                report.oldest_runnable,
                now,
                admin_name,
                since=lambda run: run.ready_at or run.created_at,
                tz=tz,
                may_lag=may_lag,
            ),
            expired_leases=Figure(report.expired_leases, link(overdue="lease")),
            due_timers=Figure(report.due_timers, link(overdue="timer")),
            oldest_due_timer=format_duration(now - oldest_due) if oldest_due is not None else "",
            finished=Figure(finished.total, link(finished="1h")),
            finished_peak=finished.peak,
            finished_from=labels[0] if labels else "",
            finished_to=labels[-1] if labels else "",
            sparkline=render_sparkline(
                finished.counts,
                labels=[f"{label}, runs finished" for label in labels],
                description=(
                    f"Runs finished per minute over the last hour: {finished.total} in all, "
                    f"at most {finished.peak} in a minute"
                ),
            ),
        )


@dataclass(frozen=True)
class LiveWorker:
    engine_id: str
    kind: str
    workflows: int
    workflow_names: str
    activity_queues: str
    heartbeat_age: str


@dataclass(frozen=True)
class StrandedRow:
    """A workflow whose active runs no live worker can execute."""

    name: str
    total: Figure
    counts: str
    """Its active runs per status, as words ("2 running, 1 waiting")."""


@dataclass(frozen=True)
class WorkerFigures:
    """The live workers and the runs none of them can execute, by workflow
    (:func:`django_weft.runtime.worker_coverage`: one query besides the report)."""

    live: tuple[LiveWorker, ...]
    stranded: tuple[StrandedRow, ...]
    stranded_runs: int

    @classmethod
    def build(cls, coverage: runtime.WorkerCoverage, *, changelist_url: str) -> WorkerFigures:
        link = _linker(changelist_url)
        live = tuple(
            LiveWorker(
                engine_id=worker.engine_id,
                kind=worker.kind,
                workflows=len(worker.workflows),
                workflow_names=", ".join(worker.workflows),
                activity_queues=", ".join(worker.activity_queues),
                heartbeat_age=format_duration(max(coverage.read_at - worker.heartbeat_at, timedelta(0))),
            )
            for worker in coverage.live
        )
        stranded = tuple(
            StrandedRow(
                name=workflow.name,
                total=Figure(workflow.total, link(workflow=workflow.name)),
                counts=", ".join(f"{count} {status}" for status, count in workflow.counts.items()),
            )
            for workflow in coverage.stranded
        )
        return cls(live=live, stranded=stranded, stranded_runs=coverage.stranded_runs)


@dataclass(frozen=True)
class KeyRow:
    """One of the busiest concurrency keys: its workflow, its key, its slots in use out of
    the workflow's limit, its runs queued and how long the one queued longest has waited;
    each count links to the runs it counts."""

    workflow: str
    key: str
    """The key as a person reads it ("(whole workflow)" for a limit without keys, or one
    whose keys share its slots)."""
    in_use: Figure
    limit: str
    """The workflow's limit in this process's code; "?" when it is not registered here."""
    queued: Figure
    queued_for: str
    """How long the run queued longest has waited; "" when none is queued."""
    full: bool
    """Every slot is taken."""

    @classmethod
    def build_all(cls, busiest: runtime.BusiestKeys, *, changelist_url: str) -> tuple[KeyRow, ...]:
        link = _linker(changelist_url)
        rows = []
        for group in busiest.keys:
            runs = {"workflow": group.workflow}
            if group.key:
                runs["concurrency_key"] = group.key
            oldest = group.oldest_queued_at
            rows.append(
                cls(
                    workflow=group.workflow,
                    key=group.key or "(whole workflow)",
                    in_use=Figure(group.in_use, link(**runs, flow="holding")),
                    limit=str(group.limit) if group.limit is not None else "?",
                    queued=Figure(group.queued, link(**runs, flow="queued")),
                    queued_for=format_duration(max(busiest.read_at - oldest, timedelta(0))) if oldest else "",
                    full=group.limit is not None and group.in_use >= group.limit,
                )
            )
        return tuple(rows)


@dataclass(frozen=True)
class BucketRow:
    """A rate limit bucket that is behind: its name, its key, the rate in force and how
    far ahead its next free moment is, in time and about in attempts."""

    name: str
    key: str
    """The key as a person reads it ("(no key)" for a limit without keys)."""
    rate: str
    """"?" when the rate limit is not registered here."""
    backlog: str
    attempts: str
    """"about N attempts"; "" when the rate is unknown."""

    @classmethod
    def build_all(cls, busy: runtime.BusyBuckets) -> tuple[BucketRow, ...]:
        return tuple(
            cls(
                name=bucket.name,
                key=bucket.key or "(no key)",
                rate=str(bucket.rate) if bucket.rate is not None else "?",
                backlog=format_duration(bucket.backlog),
                attempts=_about_attempts(bucket.backlog_attempts),
            )
            for bucket in busy.buckets
        )


@dataclass(frozen=True)
class ActivityGroupRow:
    """One of the busiest activity concurrency groups: its activity, its key, its slots
    held out of the activity's limit, its attempts waiting and how long the one waiting
    longest has waited."""

    activity: str
    key: str
    """The key as a person reads it ("(no key)" for a limit without keys)."""
    held: int
    limit: str
    """"?" when the activity is not registered here."""
    waiting: int
    waiting_for: str
    """"" when none waits."""
    full: bool

    @classmethod
    def build_all(cls, busiest: runtime.BusiestActivityGroups) -> tuple[ActivityGroupRow, ...]:
        rows = []
        for group in busiest.groups:
            oldest = group.oldest_waiting_at
            rows.append(
                cls(
                    activity=group.activity,
                    key=group.key or "(no key)",
                    held=group.held,
                    limit=str(group.limit) if group.limit is not None else "?",
                    waiting=group.waiting,
                    waiting_for=format_duration(max(busiest.read_at - oldest, timedelta(0)))
                    if oldest
                    else "",
                    full=group.limit is not None and group.held >= group.limit,
                )
            )
        return tuple(rows)


def _about_attempts(count: int | None) -> str:
    if count is None:
        return ""
    return f"about {count} attempt{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class StrandedScheduleRow:
    """A workflow no live worker has registered, with schedules due to fire it."""

    name: str
    due: Figure
    oldest_due_for: str


@dataclass(frozen=True)
class ScheduleFigures:
    """The schedules at a glance (two queries, and ``coverage``'s due schedules no live
    worker can fire), for users who may view them: how many, how many paused, how many
    whose last fire could not start a run, the next fire, and the due schedules of
    workflows no live worker has registered (the tick fires none of them)."""

    total: Figure
    paused: Figure
    failing: Figure
    next_id: str | None
    next_at: str
    next_url: str
    stranded: int = 0
    stranded_rows: tuple[StrandedScheduleRow, ...] = ()

    @classmethod
    def read(
        cls, coverage: runtime.WorkerCoverage, *, admin_name: str = "admin", may_lag: bool = False
    ) -> ScheduleFigures:
        changelist = admin_url(Schedule, "changelist", site=admin_name)
        link = _linker(changelist)
        schedules = runtime.schedule_queryset(may_lag=may_lag)
        counts = schedules.aggregate(
            total=Count("pk"),
            paused=Count("pk", filter=Q(paused=True)),
            failing=Count("pk", filter=Q(recent_actions__0__outcome="error")),
        )
        # The tick's own index (unpaused, with a next fire) finds it.
        upcoming = (
            schedules.filter(paused=False, next_fire_at__isnull=False)
            .order_by("next_fire_at")
            .only("id", "next_fire_at")
            .first()
        )
        return cls(
            total=Figure(counts["total"], changelist),
            paused=Figure(counts["paused"], link(paused__exact="1")),
            failing=Figure(counts["failing"], link(last_outcome="error")),
            next_id=upcoming.pk if upcoming is not None else None,
            next_at=moment(upcoming.next_fire_at) if upcoming is not None else "",
            next_url=admin_url(Schedule, "change", upcoming.pk, site=admin_name)
            if upcoming is not None
            else "",
            stranded=coverage.stranded_schedule_count,
            stranded_rows=tuple(
                StrandedScheduleRow(
                    name=group.name,
                    due=Figure(group.due, link(workflow=group.name, due="now")),
                    oldest_due_for=format_duration(max(coverage.read_at - group.oldest_due_at, timedelta(0))),
                )
                for group in coverage.stranded_schedules
            ),
        )


def _statuses(counts: dict[str, int]) -> tuple[str, ...]:
    """The model's statuses, then any other a row holds (a status from newer code)."""
    return STATUSES + tuple(sorted(set(counts) - set(STATUSES)))


def _linker(changelist_url: str) -> Callable[..., str]:
    def link(**params: str) -> str:
        return f"{changelist_url}?{urlencode(params)}"

    return link


def _clock(moment_: datetime) -> str:
    return date_format(timezone.localtime(moment_), "H:i")


def _oldest(
    run: runtime.RunRecord | None,
    now: datetime,
    admin_name: str,
    *,
    since: Callable[[runtime.RunRecord], datetime],
    tz: Any,
    may_lag: bool,
) -> OldestRun | None:
    if run is None:
        return None
    started = since(run)
    detail = ""
    if run.waiting_on:
        seqs = waited_positions(run.waiting_on)
        steps = runtime.read_steps_at({run.run_id: seqs}, may_lag=may_lag).get(run.run_id, {}) if seqs else {}
        detail = describe_wait(run.waiting_on, steps=steps, queue_of=queue_of, tz=tz, today=now)
    return OldestRun(
        url=admin_url(WorkflowRun, "change", run.run_id, site=admin_name),
        workflow=run.workflow,
        workflow_id=run.workflow_id,
        badge=status_badge(run.status),
        since=moment(started),
        age=format_duration(max(now - started, timedelta(0))),
        detail=detail,
    )
