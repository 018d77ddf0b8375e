"""Simulation and what-if planning: the real planner in virtual time."""
