"""What the permission matrices of the REST API (tests/api/test_permission_matrix.py) and
the admin (tests/admin/test_permission_matrix.py) share: who asks (:data:`PRINCIPALS`),
what a route needs (:class:`Needs`, read from the operations catalogue), who may
therefore pass, and a snapshot of every django_weft table and the admin log to show that
a refused request wrote nothing.

The answer expected of each cell is derived, not typed: a route needs the catalogue's
operations (:data:`django_weft.runtime.operations.OPERATIONS`), so a principal passes
when ``Operation.allowed(user)`` says so for each of them. The principals are chosen so
that the derivation is checked too: anonymous and non-staff users never pass, a staff
user without permissions passes only where staff is enough, the operator (exactly the
permissions the catalogue names) and the superuser always pass, and a staff user holding
every other django_weft permission never does (:func:`sanity`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from django_weft.runtime.operations import OPERATIONS

PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class Needs:
    """What a route needs: the catalogue's operations, all of them (``ops``); or staff
    status alone (``staff_only``); or nothing anybody holds (``nobody``: a screen no
    one may use, such as adding a run by hand). ``or_ops``: operations that grant it
    as well (the admin shows an object to whoever may change it, as Django's admin does)."""

    ops: tuple[str, ...] = ()
    staff_only: bool = False
    nobody: bool = False
    or_ops: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in (*self.ops, *self.or_ops) if name not in OPERATIONS]
        assert not unknown, f"not in the operations catalogue: {unknown}"
        assert self.ops or self.staff_only or self.nobody, "a route needs something"

    @property
    def permissions(self) -> frozenset[str]:
        """The permission codenames of :attr:`ops` (what the operator holds)."""
        return frozenset(codename for name in self.ops for codename in OPERATIONS[name].permissions)

    def allows(self, user: Any) -> bool:
        """Whether ``user`` (``None`` for anonymous) passes, by the catalogue."""
        if self.nobody:
            return False
        if self.staff_only:
            return bool(user is not None and user.is_active and user.is_staff)
        if all(OPERATIONS[name].allowed(user) for name in self.ops):
            return True
        return bool(self.or_ops) and all(OPERATIONS[name].allowed(user) for name in self.or_ops)

    def __add__(self, other: Needs) -> Needs:
        return Needs(ops=(*self.ops, *other.ops), or_ops=self.or_ops)


VIEW_RUNS = Needs(ops=("view",))
STAFF = Needs(staff_only=True)
NOBODY = Needs(nobody=True)


def needs(*ops: str) -> Needs:
    return Needs(ops=ops)


@dataclass(frozen=True)
class Principal:
    """Who sends a request: a user made for the cell (``None`` for anonymous)."""

    name: str
    authenticated: bool = True
    staff: bool = True
    superuser: bool = False
    holds: str = "none"
    """``none``, ``view`` (the view permissions), ``needed`` (the route's), ``others``
    (every django_weft permission but the route's), ``all`` (every one)."""

    def permissions(self, route: Needs) -> frozenset[str]:
        every = all_permissions()
        return {
            "none": frozenset(),
            "view": frozenset({"view_workflowrun", "view_schedule"}),
            "needed": route.permissions,
            "others": every - route.permissions,
            "all": every,
        }[self.holds]

    def make_user(self, route: Needs) -> Any:
        """The user, with the permissions this principal holds for ``route``."""
        if not self.authenticated:
            return None
        model = get_user_model()
        if self.superuser:
            return model.objects.create_superuser(self.name, password=PASSWORD)
        user = model.objects.create_user(self.name, password=PASSWORD, is_staff=self.staff)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_weft", codename__in=self.permissions(route)
            )
        )
        return model.objects.get(pk=user.pk)  # no cached permissions


PRINCIPALS = (
    Principal("anonymous", authenticated=False, staff=False),
    # Every permission, but not staff: the admin and the API are for staff.
    Principal("outsider", staff=False, holds="all"),
    Principal("staff-without-permissions"),
    Principal("viewer", holds="view"),
    Principal("operator", holds="needed"),
    Principal("staff-with-all-others", holds="others"),
    Principal("superuser", superuser=True),
)


def all_permissions() -> frozenset[str]:
    """Every permission codename of django_weft's models (Django's and the custom ones)."""
    return frozenset(
        Permission.objects.filter(content_type__app_label="django_weft").values_list("codename", flat=True)
    )


def sanity(route: Needs, principal: Principal, allowed: bool) -> None:
    """What any derivation must give, whatever the catalogue says: a check of the
    expected answers themselves."""
    if route.nobody:
        assert not allowed
    elif principal.name in ("anonymous", "outsider"):
        assert not allowed, (principal.name, route)
    elif principal.name == "staff-without-permissions":
        assert allowed == route.staff_only, (principal.name, route)
    elif principal.name in ("operator", "superuser"):
        assert allowed, (principal.name, route)
    elif principal.name == "staff-with-all-others" and not route.or_ops and not route.staff_only:
        assert not allowed, (principal.name, route)


def snapshot(extra: Iterable[type[Any]] = ()) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every django_weft table and of the admin log, in primary key order."""
    models = [*apps.get_app_config("django_weft").get_models(), LogEntry, *extra]
    return {
        model._meta.label: [
            tuple(map(repr, row)) for row in model._default_manager.order_by("pk").values_list()
        ]
        for model in models
    }


def changed_tables(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [label for label in before if before[label] != after[label]]


__all__ = [
    "NOBODY",
    "PASSWORD",
    "PRINCIPALS",
    "STAFF",
    "VIEW_RUNS",
    "Needs",
    "Principal",
    "all_permissions",
    "changed_tables",
    "needs",
    "sanity",
    "snapshot",
]
