"""The workflow runs' admin: the changelist (:mod:`.changelist`), a run's page (:mod:`.admin`,
:mod:`.tables`, :mod:`.waits`), the lifecycle actions (:mod:`.actions`), the object tools
(:mod:`.tools`, :mod:`.reset`) and the dashboard (:mod:`.dashboard`, :mod:`.sparkline`)."""

from __future__ import annotations

from .admin import WorkflowRunAdmin

__all__ = ["WorkflowRunAdmin"]
