"""Run histories as documents: the export format that ``manage.py weft_export_history``
and ``GET runs/{ref}/export/`` write and ``manage.py weft_replay --from-file`` reads, and
the stream of stored runs a replay or an export selects.

The format is ``{"format": "django_weft.history", "version": 1, "exported_at", "run":
{...}, "steps": [...]}`` (see ``docs/reference/history-format.md``). A stored run is
replayed from the same document its export would write, so a run replays identically
from the database and from its exported file.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db.models import Q

from ..engine import codec
from ..engine.errors import InvalidInput
from ..engine.records import ClaimedRun, RunStatus, StepRecord
from ..models import Step, WorkflowRun
from .process import reading_alias
from .reading import get_run

HISTORY_FORMAT = "django_weft.history"
HISTORY_VERSION = 1

_RUN_COLUMNS = (
    "id",
    "workflow_id",
    "workflow_name",
    "workflow_version",
    "status",
    "failure_category",
    "args",
    "kwargs",
    "attempt",
    "result",
    "error",
    "search_attributes",
    "waiting_on",
    "cancel_request",
    "parent_id",
    "created_at",
    "updated_at",
    "finished_at",
)
_STEP_COLUMNS = (
    "seq",
    "kind",
    "name",
    "status",
    "attempt",
    "args",
    "result",
    "error",
    "started_at",
    "finished_at",
)
_STATUSES = tuple(str(status) for status in RunStatus)
DEFAULT_BATCH = 100


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment is not None else None


def history_document(
    run: dict[str, Any], steps: Iterable[Sequence[Any]], *, exported_at: datetime
) -> dict[str, Any]:
    """The version 1 document of a run: ``run`` is the run's :data:`_RUN_COLUMNS` (a
    ``values()`` row), ``steps`` its steps' :data:`_STEP_COLUMNS` in ``seq`` order."""
    return {
        "format": HISTORY_FORMAT,
        "version": HISTORY_VERSION,
        "exported_at": _iso(exported_at),
        "run": {
            "run_id": str(run["id"]),
            "workflow_id": run["workflow_id"],
            "workflow": run["workflow_name"],
            "workflow_version": run["workflow_version"],
            "status": run["status"],
            "failure_category": run["failure_category"] or None,
            "args": run["args"],
            "kwargs": run["kwargs"],
            "attempt": run["attempt"],
            "result": run["result"],
            "error": run["error"],
            "search_attributes": run["search_attributes"],
            "waiting_on": run["waiting_on"],
            "cancel_request": run["cancel_request"],
            "parent_run_id": str(run["parent_id"]) if run["parent_id"] else None,
            "created_at": _iso(run["created_at"]),
            "updated_at": _iso(run["updated_at"]),
            "finished_at": _iso(run["finished_at"]),
        },
        "steps": [
            {
                "seq": seq,
                "kind": kind,
                "name": name,
                "status": status,
                "attempt": attempt,
                "args": args,
                "result": result,
                "error": error,
                "started_at": _iso(started_at),
                "finished_at": _iso(finished_at),
            }
            for seq, kind, name, status, attempt, args, result, error, started_at, finished_at in steps
        ],
    }


# -- selecting stored runs -----------------------------------------------------------------


@dataclass(frozen=True)
class RunSelection:
    """Which stored runs to replay or export; the filters combine (a run must match all).
    Empty filters select every run."""

    workflows: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | None = None
    """Runs created at or after this moment."""
    refs: tuple[str, ...] = ()
    """Run ids, or workflow ids meaning their latest run."""

    def __post_init__(self) -> None:
        unknown = [status for status in self.statuses if status not in _STATUSES]
        if unknown:
            raise InvalidInput(
                f"unknown run status {', '.join(map(repr, unknown))}; "
                f"a status is one of {', '.join(_STATUSES)}"
            )
        for name in self.workflows:
            flaw = codec.text_flaw(name) if isinstance(name, str) else "no text"
            if flaw:
                raise InvalidInput(f"a workflow name must not contain {flaw}; got {name[:100]!r}")
        if self.since is not None and self.since.tzinfo is None:
            raise InvalidInput(f"since must be an aware datetime; got {self.since!r}")


def stored_documents(
    selection: RunSelection, *, batch: int = DEFAULT_BATCH, may_lag: bool = False
) -> Iterator[dict[str, Any]]:
    """The documents of the selected runs, newest first, read in keyset batches of
    ``batch`` runs: two queries per batch (the runs, then all their steps), so memory
    holds one batch at a time however many runs are stored. From the primary database,
    or with ``may_lag`` from ``WEFT_READ_DATABASE`` (:func:`~.process.reading_alias`).

    Raises ``WorkflowNotFound`` for a ref that names no run (before yielding anything)."""
    if batch < 1:
        raise InvalidInput(f"batch must be a positive number of runs; got {batch!r}")
    alias = reading_alias(may_lag=may_lag)
    runs = WorkflowRun.objects.using(alias).order_by("-created_at", "id")
    if selection.refs:
        runs = runs.filter(pk__in=[get_run(ref, may_lag=may_lag).pk for ref in selection.refs])
    if selection.workflows:
        runs = runs.filter(workflow_name__in=selection.workflows)
    if selection.statuses:
        runs = runs.filter(status__in=selection.statuses)
    if selection.since is not None:
        runs = runs.filter(created_at__gte=selection.since)
    exported_at = datetime.now(UTC)
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        page = runs
        if after is not None:
            created_at, pk = after
            page = page.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__gt=pk))
        rows = list(page.values(*_RUN_COLUMNS)[:batch])
        if not rows:
            return
        steps: dict[uuid.UUID, list[tuple[Any, ...]]] = {row["id"]: [] for row in rows}
        # order_by without the model's default ordering, which would join the run table.
        step_rows = (
            Step.objects.using(alias)
            .filter(run_id__in=list(steps))
            .order_by("run_id", "seq")
            .values_list("run_id", *_STEP_COLUMNS)
        )
        for run_id, *columns in step_rows:
            steps[run_id].append(tuple(columns))
        for row in rows:
            yield history_document(row, steps[row["id"]], exported_at=exported_at)
        if len(rows) < batch:
            return
        after = (rows[-1]["created_at"], rows[-1]["id"])


def export_history(ref: str | uuid.UUID, *, may_lag: bool = False) -> dict[str, Any]:
    """The history document of one run (run id, or workflow id for its latest run), from
    the primary database or with ``may_lag`` from ``WEFT_READ_DATABASE``; raises
    ``WorkflowNotFound``."""
    run = get_run(ref, may_lag=may_lag)
    return next(stored_documents(RunSelection(refs=(str(run.pk),)), may_lag=may_lag))


# -- reading documents ---------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedHistory:
    """A history document, checked, with what a replay needs in the engine's terms."""

    source: str
    run_id: str
    workflow_id: str
    workflow_name: str
    status: str
    failure_category: str | None
    error: Any
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    created_at: datetime
    parent_run_id: str | None
    search_attributes: dict[str, Any]
    steps: dict[int, StepRecord] = field(default_factory=dict)

    def claimed(self, now: datetime) -> ClaimedRun:
        """The run as a turn would claim it (epoch 0, no pending cancellation request)."""
        return ClaimedRun(
            run_id=self.run_id,
            workflow_id=self.workflow_id,
            workflow_name=self.workflow_name,
            args=list(self.args),
            kwargs=dict(self.kwargs),
            epoch=0,
            attempt=self.attempt,
            created_at=self.created_at,
            db_now=now,
            steps=dict(self.steps),
            parent_run_id=self.parent_run_id,
            search_attributes=dict(self.search_attributes),
            cancel_request=None,
        )


class _Reader:
    """Reads one document, saying where a problem is (``<source>: run.args: ...``)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> InvalidInput:
        return InvalidInput(f"{self.source}: {where}: {problem}")

    def get(self, data: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...], *,
            required: bool = True, default: Any = None) -> Any:  # fmt: skip
        if key not in data or data[key] is None:
            if required:
                raise self.fail(f"{where}.{key}" if where else key, "missing")
            return default
        value = data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(f"{where}.{key}" if where else key, f"must be {names}; got {value!r}")
        return value

    def moment(self, data: dict[str, Any], key: str, where: str, *, required: bool) -> datetime | None:
        text = self.get(data, key, where, str, required=required)
        if text is None:
            return None
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise self.fail(f"{where}.{key}", f"must be an ISO 8601 date and time; got {text!r}") from None
        if value.tzinfo is None:
            raise self.fail(f"{where}.{key}", f"must carry a UTC offset; got {text!r}")
        return value


def parse_history(document: Any, *, source: str = "the history document") -> ParsedHistory:
    """Check a history document and return what a replay needs from it. Raises
    ``InvalidInput`` naming ``source`` and the field to fix. Keys the replay does not need
    may be absent or hold anything; unknown keys are ignored."""
    read = _Reader(source)
    if not isinstance(document, dict):
        raise read.fail("document", f"must be a JSON object; got {type(document).__name__}")
    if document.get("format") != HISTORY_FORMAT:
        raise read.fail(
            "format",
            f"must be {HISTORY_FORMAT!r}; got {document.get('format')!r} (is this a weft history export?)",
        )
    version = document.get("version")
    if version != HISTORY_VERSION:
        raise read.fail(
            "version",
            f"this django_weft reads version {HISTORY_VERSION}; got {version!r} "
            "(export it again with this version, or upgrade django_weft)",
        )
    run = read.get(document, "run", "", dict)
    steps: dict[int, StepRecord] = {}
    for index, step in enumerate(read.get(document, "steps", "", list)):
        where = f"steps[{index}]"
        if not isinstance(step, dict):
            raise read.fail(where, f"must be an object; got {step!r}")
        seq = read.get(step, "seq", where, int)
        if seq < 0 or seq in steps:
            raise read.fail(f"{where}.seq", f"must be a position (0 or more) used once; got {seq}")
        steps[seq] = StepRecord(
            seq=seq,
            kind=read.get(step, "kind", where, str),
            name=read.get(step, "name", where, str),
            status=read.get(step, "status", where, str),
            result=step.get("result"),
            error=read.get(step, "error", where, dict, required=False),
            attempt=read.get(step, "attempt", where, int, required=False, default=1),
            started_at=read.moment(step, "started_at", where, required=False),
            finished_at=read.moment(step, "finished_at", where, required=False),
        )
    created_at = read.moment(run, "created_at", "run", required=True)
    assert created_at is not None
    status = read.get(run, "status", "run", str, required=False, default="unknown")
    parent = read.get(run, "parent_run_id", "run", str, required=False)
    return ParsedHistory(
        source=source,
        run_id=read.get(run, "run_id", "run", str),
        workflow_id=read.get(run, "workflow_id", "run", str),
        workflow_name=read.get(run, "workflow", "run", str),
        status=status,
        failure_category=read.get(run, "failure_category", "run", str, required=False),
        error=run.get("error"),
        args=read.get(run, "args", "run", list, required=False, default=[]),
        kwargs=read.get(run, "kwargs", "run", dict, required=False, default={}),
        attempt=read.get(run, "attempt", "run", int, required=False, default=1),
        created_at=created_at,
        parent_run_id=parent,
        search_attributes=read.get(run, "search_attributes", "run", dict, required=False, default={}),
        steps=steps,
    )


def history_files(path: str | Path) -> list[Path]:
    """The history files at ``path``: the file itself, or a directory's ``*.json`` files
    (not its subdirectories), sorted by name. Raises ``InvalidInput`` if there are none."""
    where = Path(path)
    if where.is_dir():
        files = sorted(item for item in where.glob("*.json") if item.is_file())
        if not files:
            raise InvalidInput(f"{where}: the directory has no *.json history files")
        return files
    if not where.is_file():
        raise InvalidInput(f"{where}: no such file or directory")
    return [where]


def load_history_file(path: str | Path) -> dict[str, Any]:
    """Read one history file as JSON; ``InvalidInput`` if it cannot be read or parsed
    (its content is checked by :func:`parse_history`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot read the file: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path}: not JSON ({exc}); is it a weft_export_history file?") from None
    if not isinstance(document, dict):
        raise InvalidInput(f"{path}: document: must be a JSON object; got {type(document).__name__}")
    return document
