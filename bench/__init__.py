"""Benchmarks: `python -m bench NAME` runs one, `python -m bench all` runs every one.

Each benchmark is a module here with a `run(seconds: float | None) -> list[Figure]`; figures are
printed as `name: value unit`, and `--write BENCHMARKS.md` rewrites the table of figures there.
"""
