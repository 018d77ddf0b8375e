"""The bounds of what operators and integrations may ask of trains and upgrades: one place, read by
the API's serializers (console/api/serializers/trains.py) and the browser forms (trains/forms.py),
so both accept the same values."""

from __future__ import annotations

DAY_S = 24 * 3600
MAX_CYCLE_SLO_S = 366 * DAY_S
MAX_VISIT_ESTIMATE_S = 7 * DAY_S  # also a visit's overhead
MAX_AUTO_RESUME_S = 30 * DAY_S
MAX_DOMAINS_AT_ONCE = 100  # Train.visit_concurrency's bound
MAX_COUNT = 1_000_000  # failures, successes, hosts per visit
MAX_SOAK_S = 30 * DAY_S  # a phase's soak, an upgrade's time per host
FAILURE_RATE_DECIMALS = 4  # Upgrade.max_failure_rate's decimal places
