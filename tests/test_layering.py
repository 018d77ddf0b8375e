"""The rooms of the house and the direction of their doors: each rule is checked on the imports
of every module (parsed, not imported), so a new import the wrong way fails here with its place.

configuration (config/) wires everything; the console (console/, and each app's views, forms,
filters, admin and web selectors) and the simulator (simulation/) sit on the core; the core
(opsplanner/, and the models, services and selectors of fleet/ and trains/) imports none of them,
and the orchestration core imports nothing of trains. The adapters (adapters/) are programs that
talk HTTP: no Django, no product code."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Parts of an app that belong to the console or are entry points, not to its core.
CONSOLE_PARTS = ("views", "forms", "filters", "admin", "selectors_web", "management", "api")


def _modules(package: str) -> Iterator[Path]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from opsplanner import metrics` names a module too
                yield node.lineno, f"{node.module}.{alias.name}"


def _is_core(path: Path) -> bool:
    relative = path.relative_to(ROOT).with_suffix("").parts
    return not any(part.split(".")[0] in CONSOLE_PARTS for part in relative[1:])


def _violations(packages: tuple[str, ...], forbidden: tuple[str, ...], *, core_only: bool) -> list[str]:
    found = []
    for package in packages:
        for path in _modules(package):
            if core_only and not _is_core(path):
                continue
            for line, name in _imports(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(found))


def test_the_core_imports_neither_the_console_nor_the_simulator_nor_the_configuration() -> None:
    assert (
        _violations(
            ("opsplanner", "fleet", "trains"),
            ("console", "simulation", "config", "bench", "opsplanner_adapters"),
            core_only=True,
        )
        == []
    )


def test_the_orchestration_core_imports_nothing_of_the_trains() -> None:
    assert _violations(("opsplanner",), ("trains",), core_only=True) == []


# Where the inventory reaches into the trains on purpose, and why; a new one must be added here.
INVENTORY_USES_OF_TRAINS = {
    "fleet/fleetfile/withdrawals.py": "a file that withdraws a version counts the upgrades it will offboard or reopen",
    "fleet/selectors/owners.py": "a service owner's page shows the trains that will visit their hosts",
    "fleet/services/catalogue.py": "the one offboarding path of a withdrawn version, for the API and the file",
}


def test_the_inventory_imports_nothing_of_the_trains_but_where_it_says_why() -> None:
    found = _violations(("fleet",), ("trains",), core_only=True)
    assert [v for v in found if v.split(":")[0] not in INVENTORY_USES_OF_TRAINS] == []
    # An exception no longer used goes from the list, so the list stays the truth.
    assert sorted(INVENTORY_USES_OF_TRAINS) == sorted({v.split(":")[0] for v in found})


def test_the_simulator_does_not_import_the_console() -> None:
    assert _violations(("simulation",), ("console", "config"), core_only=False) == []


def test_the_drawing_helpers_import_no_django_and_no_product_code() -> None:
    assert (
        _violations(
            ("drawing",),
            ("django", "opsplanner", "fleet", "trains", "console", "simulation", "config"),
            core_only=False,
        )
        == []
    )


def test_the_adapters_import_no_django_and_no_product_code() -> None:
    assert (
        _violations(
            ("adapters/src",),
            ("django", "rest_framework", "celery", "opsplanner", "fleet", "trains", "console", "simulation", "config"),
            core_only=False,
        )
        == []
    )


@pytest.mark.parametrize("package", ["console", "simulation"])
def test_a_moved_room_left_no_module_behind(package: str) -> None:
    # The rooms are where their docstring says: nothing of the console or the simulator is in the core.
    leftovers = {"console": ("api", "views", "gantt", "metrics.py", "live_pages.py", "consumers.py"),
                 "simulation": ("simulation",)}[package]  # fmt: skip
    assert [name for name in leftovers if (ROOT / "opsplanner" / name).exists()] == []
