"""Trains pages: trains, upgrades, the emergency train form."""
