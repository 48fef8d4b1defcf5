"""The metrics themselves, and the observer that records them.

Metric objects are created once, at import, in ``prometheus_client``'s default registry.
Under ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn workers, Celery's prefork pool, several
``weft_worker`` processes) ``prometheus_client`` keeps each process's values in files of
that directory and an exporter sums them; the gauges the tick sets describe the database,
not the process, so they use the ``livemostrecent`` mode: the latest value written by a
live process, whichever process's tick wrote it (docs/how-to/observe.md).
"""

from __future__ import annotations

import time
from typing import Any

from ..extras import require_extra

require_extra("prometheus", "django_weft.metrics", "prometheus_client")

from prometheus_client import Counter, Gauge, Histogram  # noqa: E402

from ..engine import observe  # noqa: E402

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Seconds: from a fast inline step to a quarter of an hour."""
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Seconds from due to claimed: a healthy cluster stays in the first buckets."""

RUNS_STARTED = Counter("weft_runs_started", "Runs started, by workflow.", ["workflow"])
RUNS_FINISHED = Counter(
    "weft_runs_finished",
    "Runs that reached a terminal status (completed, failed, cancelled, timed_out, continued).",
    ["workflow", "status"],
)
ACTIVITY_ATTEMPTS = Counter(
    "weft_activity_attempts",
    "Activity attempts that ran (or flow control held), by outcome: completed, failed (for good), "
    "retried, attempt_failed (queued; its workflow decides), held, discarded, deposed, error. "
    "Replayed steps are not attempts.",
    ["activity", "outcome"],
)
ACTIVITY_DURATION = Histogram(
    "weft_activity_duration_seconds",
    "Time an activity attempt ran, whatever its outcome (held attempts left out).",
    ["activity"],
    buckets=DURATION_BUCKETS,
)
TURN_DURATION = Histogram(
    "weft_turn_duration_seconds",
    "Time a turn held its run, from the claim to its commit (replay included).",
    ["workflow"],
    buckets=DURATION_BUCKETS,
)
SCHEDULE_TO_START = Histogram(
    "weft_schedule_to_start_seconds",
    "From when work was due to when a worker claimed it: first_turn, woken, takeover, activity.",
    ["kind"],
    buckets=LATENCY_BUCKETS,
)
LEASE_TAKEOVERS = Counter("weft_lease_takeovers", "Runs taken over from an owner whose lease had expired.")
DEPOSED_WRITES = Counter(
    "weft_deposed_writes", "Writes fencing refused because their owner had lost the run to a newer epoch."
)
SCHEDULE_FIRES = Counter(
    "weft_schedule_fires",
    "Schedule fires, by outcome: started, already_started, skipped, buffered, missed, error.",
    ["schedule", "outcome"],
)
RUNS = Gauge(
    "weft_runs",
    'Runs per status, read by the tick; estimate="true" where the figure comes from PostgreSQL\'s '
    "statistics (terminal statuses) rather than a count.",
    ["status", "estimate"],
    multiprocess_mode="livemostrecent",
)
DUE_TIMERS = Gauge(
    "weft_due_timers",
    "Durable timers due and not fired yet, read by the tick.",
    multiprocess_mode="livemostrecent",
)
OLDEST_DUE_AGE = Gauge(
    "weft_oldest_due_seconds",
    "Seconds since the oldest due item (an unfired timer, a runnable run nobody claimed) was due; "
    "0 when nothing is due. Read by the tick.",
    multiprocess_mode="livemostrecent",
)
QUEUED_RUNS = Gauge(
    "weft_queued_runs",
    "Runs queued for a concurrency slot, by workflow and concurrency key, read by the tick.",
    ["workflow", "key"],
    multiprocess_mode="livemostrecent",
)
SAMPLED_AT = Gauge(
    "weft_queues_sampled_at_seconds",
    "When the tick last read the gauges above (Unix time, the database's clock).",
    multiprocess_mode="livemostrecent",
)


class PrometheusObserver(observe.Observer):
    """Records the metrics above from the observation points."""

    samples_queues = True

    def __init__(self) -> None:
        # Label sets set by the previous sample: one that is gone is set to 0 (under
        # PROMETHEUS_MULTIPROC_DIR a removed child would stay in the files as it was).
        self._queued_keys: set[tuple[str, str]] = set()
        # The labelled children of the per-step metrics, kept: labels() validates and
        # locks on every call, and an attempt is on the hot path. (Dict reads and writes
        # are atomic; two threads creating the same child get the same one.)
        self._attempts: dict[tuple[str, str], Any] = {}
        self._durations: dict[str, Any] = {}

    def run_started(self, *, workflow: str, **_: Any) -> None:
        RUNS_STARTED.labels(workflow).inc()

    def run_finished(self, *, workflow: str, status: str, **_: Any) -> None:
        RUNS_FINISHED.labels(workflow, status).inc()

    def turn_finished(self, scope: observe.TurnScope) -> None:
        TURN_DURATION.labels(scope.claimed.workflow_name).observe(time.perf_counter() - scope.started)

    def attempt_finished(self, scope: observe.AttemptScope) -> None:
        name, outcome = scope.info.activity_name, str(scope.outcome or "error")
        counter = self._attempts.get((name, outcome))
        if counter is None:
            counter = self._attempts[(name, outcome)] = ACTIVITY_ATTEMPTS.labels(name, outcome)
        counter.inc()
        if outcome != observe.AttemptOutcome.HELD:
            duration = self._durations.get(name)
            if duration is None:
                duration = self._durations[name] = ACTIVITY_DURATION.labels(name)
            duration.observe(time.perf_counter() - scope.started)

    def schedule_to_start(self, *, kind: str, delay: float, **_: Any) -> None:
        SCHEDULE_TO_START.labels(str(kind)).observe(delay)

    def lease_taken_over(self, **_: Any) -> None:
        LEASE_TAKEOVERS.inc()

    def deposed_write(self, **_: Any) -> None:
        DEPOSED_WRITES.inc()

    def schedule_fired(self, *, schedule_id: str, outcome: str, **_: Any) -> None:
        SCHEDULE_FIRES.labels(schedule_id, outcome).inc()

    def queue_sampled(self, sample: observe.QueueSample) -> None:
        for status, number in sample.runs_by_status.items():
            estimated = status in sample.estimated
            RUNS.labels(status, "true" if estimated else "false").set(number)
        DUE_TIMERS.set(sample.due_timers)
        OLDEST_DUE_AGE.set(sample.oldest_due_age or 0.0)
        for gone in self._queued_keys - set(sample.queued_by_key):
            QUEUED_RUNS.labels(*gone).set(0)
        for (workflow, key), number in sample.queued_by_key.items():
            QUEUED_RUNS.labels(workflow, key).set(number)
        self._queued_keys = set(sample.queued_by_key)
        SAMPLED_AT.set(sample.read_at.timestamp())
