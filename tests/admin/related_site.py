"""A test-only admin site (mounted by :mod:`tests.admin.related_urls`) showing the runs of
a test model with :func:`django_weft.admin.related_runs`, as a project shows its orders'
runs. Kept off ``admin.site`` so the other admin tests see the usual index."""

from __future__ import annotations

from django.contrib import admin

from django_weft.admin import related_runs
from tests.testapp.models import LedgerEntry

site = admin.AdminSite(name="related_admin")


@admin.register(LedgerEntry, site=site)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = ("key", "amount")
    fields = ("key", "amount", "runs_by_id", "runs_by_attribute")
    readonly_fields = ("runs_by_id", "runs_by_attribute")
    runs_by_id = related_runs(workflow_id="ledger-{key}", limit=3, description="runs of this entry")
    runs_by_attribute = related_runs(search_attribute="ledger_id", limit=3, description="runs tagged with it")
