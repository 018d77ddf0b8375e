"""python manage.py demo_alive: put the demo fleet in motion (trains, upgrades, an approval waiting,
an opt-out, a reservation, a broken host; trains/demo.py). Once: a fleet with trains is left alone."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from trains.demo import demo_bring_alive, demo_is_alive


class Command(BaseCommand):
    help = "Put the demo fleet in motion: a train per pool, upgrades in flight, an approval waiting."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operator", default="operator", help="the operator the demo acts as")

    def handle(self, *args: object, operator: str, **options: object) -> None:
        if demo_is_alive():
            self.stdout.write("demo_alive: the fleet already has trains; nothing changed")
            return
        user = get_user_model().objects.filter(username=operator, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {operator!r}: the demo acts as an operator (run in DEBUG)")
        try:
            alive = demo_bring_alive(operator=user)
        except ValidationError as error:
            raise CommandError(f"refused: {' '.join(error.messages)}") from None
        self.stdout.write(
            f"demo_alive: {alive.trains} trains, {alive.upgrades} upgrades, "
            f"{'an emergency train waiting for approval, ' if alive.approval_waiting else ''}"
            f"{alive.broken_host or 'no host'} broken and in repair"
        )
