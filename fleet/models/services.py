"""Services that run on hosts, their owners, opt-out windows and capacity reservations."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from fleet.models.hosts import Host
from fleet.models.pools import NAME_VALIDATOR, Pool
from opsplanner import clock


class Service(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    display_name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    owners = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="owned_services", blank=True)
    hosts = models.ManyToManyField(Host, through="ServicePlacement", related_name="services")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ServicePlacement(models.Model):
    """A service running on a host, with how many of its jobs a drain of that host interrupts."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="placements")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="placements")
    running_jobs = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["service", "host"],
                name="placement_unique_service_host",
                violation_error_message="This service is already placed on that host.",
            )
        ]
        indexes = [models.Index(fields=["host"], name="placement_host_idx")]

    def __str__(self) -> str:
        return f"{self.service_id} on {self.host_id}"


class _TimeWindow(models.Model):
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=500)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=clock.now)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def clean(self) -> None:
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "The end must be after the start."})

    def is_active_at(self, moment: dt.datetime) -> bool:
        return self.cancelled_at is None and self.starts_at <= moment < self.ends_at


class OptOutWindow(_TimeWindow):
    """A service owner's request that trains avoid the service's hosts for a while, if possible."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="optout_windows")

    class Meta:
        verbose_name = "opt-out window"
        ordering = ["starts_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=F("starts_at")),
                name="optout_ends_after_start",
                violation_error_message="The end must be after the start.",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="optout_reason_given"),
        ]
        indexes = [models.Index(fields=["service", "ends_at"], name="optout_service_end_idx")]

    def __str__(self) -> str:
        return f"opt-out {self.service_id} {self.starts_at:%Y-%m-%d %H:%M} to {self.ends_at:%Y-%m-%d %H:%M}"


class CapacityReservation(_TimeWindow):
    """At least min_hosts_in_service hosts of pool stay in service between starts_at and ends_at."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="reservations")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="reservations")
    min_hosts_in_service = models.PositiveIntegerField()

    class Meta:
        ordering = ["starts_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=F("starts_at")),
                name="reservation_ends_after_start",
                violation_error_message="The end must be after the start.",
            ),
            models.CheckConstraint(
                condition=Q(min_hosts_in_service__gt=0),
                name="reservation_positive_hosts",
                violation_error_message="Reserve at least one host.",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="reservation_reason_given"),
        ]
        indexes = [models.Index(fields=["pool", "ends_at"], name="reservation_pool_end_idx")]

    def __str__(self) -> str:
        return f"reserve {self.min_hosts_in_service} of pool {self.pool_id} for {self.service_id}"
