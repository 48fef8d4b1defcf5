from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from django_weft import WeftError, WorkflowNotFound, client

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "amount", "status", "receipt", "workflow_status", "created_at")
    list_filter = ("status",)
    search_fields = ("customer", "receipt")
    readonly_fields = ("status", "receipt", "workflow_status", "created_at", "updated_at")
    actions = ("start_fulfilment",)

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
                handle = client.start("orders.fulfil", args=[order.pk], id=order.workflow_id)
            except WeftError as exc:
                self.message_user(request, f"{order}: {exc}", messages.ERROR)
                continue
            started += 1
            self.message_user(request, f"{order}: run {handle.run_id} ({handle.status()})")
        if started:
            self.message_user(request, "A running weft_worker picks the runs up within a second.")
