"""FilterSets for trains, visits and upgrades (API and UI)."""

from __future__ import annotations

import django_filters

from console.filters import StrictFilterSet
from trains.models import Train, TrainState, Upgrade, UpgradeState, Visit, VisitState


class TrainFilter(StrictFilterSet):
    pool = django_filters.NumberFilter(field_name="pool_id")
    state = django_filters.MultipleChoiceFilter(choices=TrainState.choices)

    class Meta:
        model = Train
        fields = ["pool", "state", "emergency"]


class VisitFilter(StrictFilterSet):
    train = django_filters.NumberFilter(field_name="train_id")
    cycle = django_filters.NumberFilter(field_name="cycle_id")
    domain = django_filters.NumberFilter(field_name="domain_id")
    state = django_filters.MultipleChoiceFilter(choices=VisitState.choices)

    class Meta:
        model = Visit
        fields = ["train", "cycle", "domain", "state"]


class UpgradeFilter(StrictFilterSet):
    pool = django_filters.NumberFilter(field_name="pool_id")
    state = django_filters.MultipleChoiceFilter(choices=UpgradeState.choices)

    class Meta:
        model = Upgrade
        fields = ["pool", "state", "emergency"]
