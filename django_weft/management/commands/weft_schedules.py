"""``manage.py weft_schedules sync|list``: schedules declared in code, and all schedules."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ... import runtime
from ...engine.errors import WeftError


class Command(BaseCommand):
    help = (
        "sync: create or update the schedules declared with @workflow(schedules=[...]) (--prune deletes "
        "managed ones no longer declared; --dry-run only reports). list: every schedule with its next fire."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True, metavar="{sync,list}")
        sync = commands.add_parser("sync", help="make the database match the schedules declared in code")
        sync.add_argument("--prune", action="store_true", help="delete managed schedules no longer declared")
        sync.add_argument("--dry-run", action="store_true", help="report what would change, change nothing")
        commands.add_parser("list", help="list the schedules")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["command"] == "sync":
            self._sync(prune=options["prune"], dry_run=options["dry_run"])
        else:
            self._list()

    def _sync(self, *, prune: bool, dry_run: bool) -> None:
        try:
            report = runtime.sync_schedules(prune=prune, dry_run=dry_run)
        except WeftError as exc:
            raise CommandError(str(exc)) from exc
        would = "would be " if dry_run else ""
        for schedule_id in report.created:
            self.stdout.write(f"{schedule_id}: {would}created")
        for schedule_id, fields in report.updated.items():
            self.stdout.write(f"{schedule_id}: {would}updated ({', '.join(fields)})")
        for schedule_id in report.deleted:
            self.stdout.write(f"{schedule_id}: {would}deleted (no longer declared)")
        for schedule_id in report.conflicts:
            self.stderr.write(
                f"{schedule_id}: declared in code, but a schedule made by hand has this id; left alone "
                "(delete it, or rename the declaration)"
            )
        self.stdout.write(
            f"{len(report.created)} created, {len(report.updated)} updated, "
            f"{len(report.unchanged)} unchanged, {len(report.deleted)} deleted, "
            f"{len(report.conflicts)} conflicts" + (" (dry run)" if dry_run else "")
        )

    def _list(self) -> None:
        schedules = runtime.list_schedules()
        if not schedules:
            self.stdout.write("no schedules")
            return
        for schedule in schedules:
            spec = runtime.schedules.spec_of(schedule).describe()
            if schedule.paused:
                upcoming = "paused" + (f" ({schedule.note})" if schedule.note else "")
            elif schedule.next_fire_at is None:
                upcoming = "ended"
            else:
                upcoming = f"next {timezone.localtime(schedule.next_fire_at):%Y-%m-%d %H:%M:%S %Z}"
            self.stdout.write(
                f"{schedule.pk}  {schedule.workflow_name}  {spec}  overlap={schedule.overlap}  {upcoming}  "
                f"fired={schedule.fired_count} skipped={schedule.skipped_count} "
                f"missed={schedule.missed_count}" + ("  [managed]" if schedule.managed else "")
            )
