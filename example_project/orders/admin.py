from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from django_weft import WeftError, WorkflowNotFound, client
from django_weft.admin import related_runs
from django_weft.conf import weft_settings

from .models import Order


def _who_runs_it() -> str:
    """Which workers pick a new run up, in the words of this project's set-up."""
    if weft_settings.DISPATCHER.startswith("django_weft.contrib.celery"):
        return "A Celery worker picks the new runs up at once (scripts/run-example starts one)."
    return "A running `manage.py weft_worker` picks the new runs up within a second."


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "amount", "status", "receipt", "workflow_status", "created_at")
    list_filter = ("status",)
    search_fields = ("customer", "receipt")
    readonly_fields = ("status", "receipt", "workflow_status", "created_at", "updated_at", "workflow_runs")
    actions = ("start_fulfilment", "give_warehouse_slot")
    # The order's page lists its fulfilment runs (every run of "order-<pk>", newest first),
    # each linking to the run's page in the admin.
    workflow_runs = related_runs(workflow_id=lambda order: order.workflow_id, description="fulfilment runs")

    @admin.display(description="workflow")
    def workflow_status(self, order: Order) -> str:
        try:
            return client.get_handle(order.workflow_id).status()
        except WorkflowNotFound:
            return "-"

    @admin.action(description="Start fulfilment of the selected orders")
    def start_fulfilment(self, request: HttpRequest, queryset: QuerySet[Order]) -> None:
        started = 0
        for order in queryset:
            try:
                existing = client.get_handle(order.workflow_id)
            except WorkflowNotFound:
                existing = None
            if existing is not None:
                self.message_user(
                    request,
                    f"{order}: already has run {existing.run_id} ({existing.status()}); nothing new started.",
                    messages.WARNING,
                )
                continue
            try:
                handle = client.start("orders.fulfil", args=[order.pk], id=order.workflow_id)
            except WeftError as exc:
                self.message_user(request, f"{order}: {exc}", messages.ERROR)
                continue
            started += 1
            self.message_user(request, f"{order}: started run {handle.run_id}.")
        if started:
            self.message_user(request, _who_runs_it())

    @admin.action(description="Give the selected orders a warehouse slot (signal warehouse_slot)")
    def give_warehouse_slot(self, request: HttpRequest, queryset: QuerySet[Order]) -> None:
        for order in queryset:
            try:
                handle = client.get_handle(order.workflow_id)
                handle.signal("warehouse_slot", f"dock {order.pk % 4 + 1}")
            except WorkflowNotFound:
                self.message_user(
                    request, f"{order}: has no run; start its fulfilment first.", messages.WARNING
                )
            except WeftError as exc:
                # A finished run takes no more signals (WorkflowTerminalError says so).
                self.message_user(request, f"{order}: {exc}", messages.WARNING)
            else:
                self.message_user(request, f"{order}: signal sent to run {handle.run_id}.")
