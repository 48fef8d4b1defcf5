"""Which admin pages read ``WEFT_READ_DATABASE``: the pages that only show rows (the
changelists, a run's page, a schedule's page to a user who may not change it, the
dashboard). Such a page marks its request with :func:`show_only`; the model admins'
querysets and the runtime's reads for that request then go to the read database and may
lag behind the latest writes (docs/explanation/scaling.md, "Read replicas").

Every other request reads the primary database: an action's confirmation and its POST,
a tool's form, a change form that may be saved. A page that follows an action (the
redirect back to the list) is a page like any other, and may not show the action's
outcome yet when the replica lags.
"""

from __future__ import annotations

from django.http import HttpRequest

SHOWING_METHODS = frozenset({"GET", "HEAD"})
_MARK = "weft_reads_may_lag"


def show_only(request: HttpRequest) -> None:
    """Mark ``request`` as a page that only shows rows, if it is a GET or a HEAD (a POST
    to the same view acts, and reads the primary database)."""
    if request.method in SHOWING_METHODS:
        setattr(request, _MARK, True)


def reads_may_lag(request: HttpRequest) -> bool:
    """Whether ``request`` was marked by :func:`show_only`: its reads may lag."""
    return bool(getattr(request, _MARK, False))


__all__ = ["reads_may_lag", "show_only"]
