"""python manage.py seed_demo --hosts N: build (or complete) the demo fleet. A second run changes nothing."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import demo
from fleet.models import Host
from fleet.seeding import demo_fleet_seed
from opsplanner.progress import Progress


class Command(BaseCommand):
    help = "Build a believable demo fleet: pools, racks, hosts, components, versions, services, opt-outs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hosts", type=int, default=2000, help="how many hosts (default 2000)")
        parser.add_argument("--seed", type=int, default=42, help="random seed for versions (default 42)")
        parser.add_argument(
            "--if-empty", action="store_true", help="do nothing when the fleet already has hosts (for make run)"
        )

    def handle(self, *args: object, hosts: int, seed: int, if_empty: bool, **options: object) -> None:
        if not demo.MIN_HOSTS <= hosts <= demo.MAX_HOSTS:
            raise CommandError(f"--hosts must be between {demo.MIN_HOSTS} and {demo.MAX_HOSTS:,}, not {hosts:,}")
        if if_empty and Host.objects.exists():
            self.stdout.write("seed_demo: the fleet already has hosts; leaving it alone (--if-empty)")
            return
        report = demo_fleet_seed(hosts=hosts, seed=seed, progress=Progress("seed_demo", stream=self.stderr))
        created = ", ".join(f"{what} {count:,}" for what, count in report.created.items() if count)
        self.stdout.write(f"seed_demo: created {created}" if created else "seed_demo: nothing to do")
