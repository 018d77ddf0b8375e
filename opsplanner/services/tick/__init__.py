"""The scheduler tick: one reconcile per pool, under that pool's row lock, in one transaction.

expire → advance (drains, executions, verifications, returns; handover and repair) → admit.
A second tick running at once finds the pool locked and skips it.
"""

from opsplanner.services.tick.run import TickReport, fleet_tick, pool_tick

__all__ = ["TickReport", "fleet_tick", "pool_tick"]
