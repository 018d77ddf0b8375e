"""Components, their versions, what each host runs, and which versions work together."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from fleet.models.hosts import Host
from fleet.models.pools import NAME_VALIDATOR
from fleet.versions import MAX_VERSION_LENGTH, SORT_KEY_LENGTH, validate_version, version_sort_key
from opsplanner import clock


class ComponentLayer(models.TextChoices):
    """Job-facing components are pinned pool-wide; lower-level ones slide, one visit at a time."""

    JOB_FACING = "job_facing", "Job-facing (pinned pool-wide)"
    LOWER_LEVEL = "lower_level", "Lower-level (slides)"


class Component(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    display_name = models.CharField(max_length=120)
    layer = models.CharField(max_length=16, choices=ComponentLayer.choices)
    needs_reboot = models.BooleanField(default=True, help_text="installing it takes a reboot")
    needs_drain = models.BooleanField(default=True, help_text="installing it needs the host drained")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(layer__in=ComponentLayer.values),
                name="component_layer_valid",
                violation_error_message="Unknown component layer.",
            )
        ]

    def __str__(self) -> str:
        return self.name


class WithdrawnBy(models.TextChoices):
    """Who withdrew a version, so that what lifts a withdrawal knows whose it lifts."""

    NOT_WITHDRAWN = "", "Not withdrawn"
    OFFBOARDING = "offboarding", "The offboarding of an upgrade to it (re-onboarding the upgrade lifts it)"
    OPERATOR = "operator", "An operator, through the API or the admin (released there)"
    FLEET_FILE = "fleet_file", "The fleet file (released in the file)"


WITHDRAWN_BY_SOMEONE = [WithdrawnBy.OFFBOARDING, WithdrawnBy.OPERATOR, WithdrawnBy.FLEET_FILE]
# Where each withdrawal is released, as the refusals elsewhere say it (re-onboarding, the API, the file).
RELEASED_WHERE: dict[str, str] = {
    WithdrawnBy.OFFBOARDING: "the offboarding of its upgrade withdrew it: re-onboard that upgrade (an approval)",
    WithdrawnBy.OPERATOR: "an operator withdrew it: release it through the API (versions/…/release/)",
    WithdrawnBy.FLEET_FILE: "the fleet file withdrew it: release it in the file (drop its `withdrawn`)",
}


class ComponentVersion(models.Model):
    component = models.ForeignKey(Component, on_delete=models.PROTECT, related_name="versions")
    version = models.CharField(max_length=MAX_VERSION_LENGTH, validators=[validate_version])
    sort_key = models.CharField(max_length=SORT_KEY_LENGTH, editable=False)
    released_at = models.DateTimeField(default=clock.now)
    withdrawn_at = models.DateTimeField(
        null=True, blank=True, help_text="set when an upgrade to it was offboarded: no host returns running it"
    )
    withdrawn_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    withdrawn_by = models.CharField(
        max_length=16, choices=WithdrawnBy.choices, blank=True, default=WithdrawnBy.NOT_WITHDRAWN, db_default=""
    )

    class Meta:
        ordering = ["component_id", "sort_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["component", "version"],
                name="component_version_unique",
                violation_error_message="This component already has that version.",
            ),
            # The target of installed versions' composite foreign key (version, component).
            models.UniqueConstraint(fields=["id", "component"], name="component_version_id_component_unique"),
            models.CheckConstraint(condition=~Q(sort_key=""), name="component_version_sort_key_set"),
            models.CheckConstraint(
                condition=Q(withdrawn_at__isnull=True, withdrawn_by="")
                | Q(withdrawn_at__isnull=False, withdrawn_by__in=WITHDRAWN_BY_SOMEONE),
                name="component_version_withdrawn_by_set",
                violation_error_message="A withdrawn version says who withdrew it; one not withdrawn says nobody.",
            ),
        ]
        indexes = [models.Index(fields=["component", "sort_key"], name="component_version_order_idx")]

    def __str__(self) -> str:
        return f"{self.component.name} {self.version}" if self.component_id else self.version

    def clean(self) -> None:
        # The key is derived, so it is filled here where full_clean (admin, services) passes.
        try:
            self.sort_key = version_sort_key(self.version)
        except ValidationError as error:
            raise ValidationError({"version": error.messages}) from None
        # Withdrawn or lifted in a form (the admin): that is an operator's act.
        if self.withdrawn_at is None:
            self.withdrawn_by = WithdrawnBy.NOT_WITHDRAWN
        elif not self.withdrawn_by:
            self.withdrawn_by = WithdrawnBy.OPERATOR


class InstalledVersion(models.Model):
    """The version of one component on one host: exactly one row per host and component."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="installed_versions")
    component = models.ForeignKey(Component, on_delete=models.PROTECT, related_name="+")
    version = models.ForeignKey(ComponentVersion, on_delete=models.PROTECT, related_name="installations")
    previous_version = models.ForeignKey(
        ComponentVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="what the host ran before: the version a rollback restores",
    )
    installed_at = models.DateTimeField(default=clock.now)
    # Drift: the host reported running something other than what OpsPlanner believed. The version it
    # reported is recorded (trains see it); drift_from keeps what was believed until a report matches.
    drift_from = models.ForeignKey(
        ComponentVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="what OpsPlanner believed when the host last reported something else (none: no drift)",
    )
    drift_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host_id", "component_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["host", "component"],
                name="installed_version_one_per_host_component",
                violation_error_message="This host already has a version of that component.",
            ),
            models.CheckConstraint(
                condition=Q(drift_from__isnull=True, drift_at__isnull=True)
                | Q(drift_from__isnull=False, drift_at__isnull=False),
                name="installed_version_drift_complete",
            ),
        ]
        indexes = [
            models.Index(fields=["component", "version"], name="installed_comp_version_idx"),
            # Few rows drift: the hosts list's ?drift=true and the metric probe only those.
            models.Index(fields=["host"], condition=Q(drift_from__isnull=False), name="installed_drift_host_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.host_id}: {self.version}"

    def clean(self) -> None:
        if (
            self.version_id is not None
            and self.component_id is not None
            and self.version.component_id != self.component_id
        ):
            raise ValidationError({"version": f"Version {self.version} is not a version of {self.component.name}."})


class CompatibilityRule(models.Model):
    """Lower-level component versions that work with one job-facing version.

    For a pair (job-facing version J, lower-level component C) with rules, a host running J must run
    a version of C inside one of the rules' ranges. A pair without rules is unconstrained. Bounds are
    inclusive; an empty bound is open.
    """

    job_facing_version = models.ForeignKey(
        ComponentVersion, on_delete=models.PROTECT, related_name="compatibility_rules"
    )
    lower_component = models.ForeignKey(Component, on_delete=models.PROTECT, related_name="+")
    min_version = models.CharField(max_length=MAX_VERSION_LENGTH, blank=True, validators=[validate_version])
    min_key = models.CharField(max_length=SORT_KEY_LENGTH, blank=True, editable=False)
    max_version = models.CharField(max_length=MAX_VERSION_LENGTH, blank=True, validators=[validate_version])
    max_key = models.CharField(max_length=SORT_KEY_LENGTH, blank=True, editable=False)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["job_facing_version_id", "lower_component_id", "min_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["job_facing_version", "lower_component", "min_key", "max_key"],
                name="compat_rule_unique",
                violation_error_message="This compatibility rule exists already.",
            ),
            models.CheckConstraint(
                condition=Q(min_key="") | Q(max_key="") | Q(min_key__lte=models.F("max_key")),
                name="compat_rule_min_not_above_max",
                violation_error_message="The lowest compatible version must not be above the highest.",
            ),
            models.CheckConstraint(
                condition=(Q(min_version="") & Q(min_key="")) | (~Q(min_version="") & ~Q(min_key="")),
                name="compat_rule_min_key_matches",
            ),
            models.CheckConstraint(
                condition=(Q(max_version="") & Q(max_key="")) | (~Q(max_version="") & ~Q(max_key="")),
                name="compat_rule_max_key_matches",
            ),
        ]

    def __str__(self) -> str:
        low = self.min_version or "any"
        high = self.max_version or "any"
        return f"{self.job_facing_version} needs {self.lower_component} in [{low}, {high}]"

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        for bound in ("min", "max"):
            version = getattr(self, f"{bound}_version")
            try:
                setattr(self, f"{bound}_key", version_sort_key(version) if version else "")
            except ValidationError as error:
                errors[f"{bound}_version"] = error.messages
        if not errors and self.min_key and self.max_key and self.min_key > self.max_key:
            errors["max_version"] = [f"{self.max_version} is below the lowest version {self.min_version}."]
        if (
            self.job_facing_version_id is not None
            and self.job_facing_version.component.layer != ComponentLayer.JOB_FACING
        ):
            errors["job_facing_version"] = [f"{self.job_facing_version.component.name} is not a job-facing component."]
        if self.lower_component_id is not None and self.lower_component.layer != ComponentLayer.LOWER_LEVEL:
            errors["lower_component"] = [f"{self.lower_component.name} is not a lower-level component."]
        if errors:
            raise ValidationError(errors)

    def allows(self, sort_key: str) -> bool:
        return (not self.min_key or self.min_key <= sort_key) and (not self.max_key or sort_key <= self.max_key)
