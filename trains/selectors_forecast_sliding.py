"""How the per-upgrade forecast (trains/selectors_forecast.py) plays a sliding train: not on
visit_concurrency lanes, but as its release rule moves on (trains/services/tick.py `_slide_step`):
the next domain starts once the visit before it has released every host and fewer hosts than the
train's allowance are out (pace.sliding_allowance), sized with the time its hosts still out may take
first (budget.sliding_in_flight_s). Played on lanes, two domains of a sliding train ran at once in the
forecast where the train started the second only as the first's last hosts went out, with less time
left: the forecast said cycle 1 where the train took cycle 2 (a reviewer's probe, h1)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import NamedTuple

from trains.models import Train
from trains.services.budget import VisitSizing


class HostsOut(NamedTuple):
    """A visit's hosts still out at the end of its play: its last wave."""

    back_at: dt.datetime
    hosts: int
    per_wave_s: float  # what one of its hosts takes, as sliding_in_flight_s prices it
    unreleased: bool = False  # a running visit with hosts not yet released holds the next domain back


@dataclass
class SlidingFlow:
    """A sliding train's hosts out as its visits are played, and when its next domain may start."""

    allowance: int
    hosts_at_once: int
    tail: float
    next_at: dt.datetime
    out: list[HostsOut] = field(default_factory=list)

    def in_flight_s(self) -> float:
        """What the hosts still out when the next domain starts may take first (sliding_in_flight_s)."""
        out = [o.per_wave_s for o in self.out if o.back_at > self.next_at]
        return max(out, default=0.0) * self.tail

    def played(self, starts_at: dt.datetime, cost_s: float, hosts: int) -> dt.datetime:
        """A visit started at `starts_at` over `hosts` hosts for `cost_s` (its waves one after another):
        when its hosts are all back; the next domain may start once its last wave went out."""
        if cost_s <= 0 or hosts <= 0:
            return starts_at  # it took nothing: the next domain starts at once, as the tick's does
        waves = -(-hosts // self.hosts_at_once)
        per_wave = dt.timedelta(seconds=cost_s / waves)
        released = starts_at + per_wave * (waves - 1)
        self.out = [o for o in self.out if o.back_at > released]
        self.out.append(
            HostsOut(starts_at + per_wave * waves, hosts - (waves - 1) * self.hosts_at_once, cost_s / waves)
        )
        self.next_at = self._room_at(released)
        return starts_at + per_wave * waves

    def _room_at(self, at: dt.datetime) -> dt.datetime:
        """The first instant from `at` with fewer hosts out than the allowance."""
        for back_at in sorted(o.back_at for o in self.out):
            if sum(o.hosts for o in self.out if o.back_at > at) < self.allowance:
                return at
            at = max(at, back_at)
        return at


def sliding_flow_open(sizing: VisitSizing, train: Train, at: dt.datetime, running: list[HostsOut]) -> SlidingFlow:
    """The flow of a cycle from `at`, with its running visits' hosts out: the allowance as
    pace.sliding_allowance (a domain's worth per visit_concurrency, within the planned buffer,
    read back from the sizing's share of it, no query); the next domain held back until a running
    visit with hosts not yet released sends out its last wave."""
    allowance = max(1, min(sizing.largest_domain, sizing.hosts_at_once) * train.visit_concurrency)
    flow = SlidingFlow(allowance, sizing.hosts_at_once, sizing.tail, at, list(running))
    held = [o.back_at - dt.timedelta(seconds=o.per_wave_s) for o in running if o.unreleased]
    flow.next_at = flow._room_at(max([at, *held]))
    return flow
