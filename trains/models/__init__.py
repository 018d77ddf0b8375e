from trains.models.trains import (
    LIVE_TRAIN_STATES,
    STOPPED_TRAIN_STATES,
    BudgetCode,
    Cycle,
    Pace,
    Train,
    TrainState,
    TrainStop,
    Visit,
    VisitState,
)
from trains.models.upgrades import CarriedHost, Upgrade, UpgradePhase, UpgradeState, VisitOperation

__all__ = [
    "LIVE_TRAIN_STATES",
    "STOPPED_TRAIN_STATES",
    "BudgetCode",
    "CarriedHost",
    "Cycle",
    "Pace",
    "Train",
    "TrainState",
    "TrainStop",
    "Upgrade",
    "UpgradePhase",
    "UpgradeState",
    "Visit",
    "VisitOperation",
    "VisitState",
]
