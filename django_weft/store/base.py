"""What the areas of the store share besides the database helper: the fencing error of a
rejected owner write, and the error an update left unanswered by a closed run gets."""

from __future__ import annotations

from ..engine.error_types import UPDATE_ERROR_ON_CLOSE, ErrorType
from ..engine.errors import Deposed


def unanswered_error(status: str) -> dict[str, str]:
    return {
        # A run its workflow ended cancelled answers as an external cancel would.
        "type": UPDATE_ERROR_ON_CLOSE.get(status, ErrorType.RUN_FINISHED),
        "message": f"the run finished ({status}) before it applied this update",
    }


def deposed(run_id: str, owner: str, epoch: int, what: str) -> Deposed:
    return Deposed(
        f"run {run_id}: {what} rejected, engine {owner} no longer owns it at epoch {epoch}",
        run_id=run_id,
        owner=owner,
        epoch=epoch,
    )
