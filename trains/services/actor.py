"""Who the train scheduler's events and submitted operations name as their actor."""

ACTOR = "train-scheduler"
