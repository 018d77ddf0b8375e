"""A short soak of the embedded default (`python -m bench embedded_soak` runs the long one).

`serve` with nothing but Python, for two minutes, while one core is kept busy by another
process: a client loads every page once a second, trains run on every pool and reboots are
submitted through the API. No child may crash, no page may fail, and work must finish; the demo
comes alive by itself (a train visit runs within a minute, an approval waits).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.embedded_soak import soak

pytestmark = pytest.mark.slow

SOAK_SECONDS = 120


def test_the_embedded_default_stays_up_under_load_with_no_crash_and_no_failed_page(tmp_path: Path) -> None:
    result = soak(SOAK_SECONDS, demo_hosts=200, cpu_load=True, var_dir=tmp_path / "var")
    context = result.serve_output[-3000:]
    assert result.serve_alive, context
    assert result.crashes == 0, context
    assert result.page_errors == [], context
    assert result.page_loads >= SOAK_SECONDS  # the client kept loading pages the whole time
    assert result.operations_submitted >= 10
    assert result.operations_finished >= 1, f"{result.operations_finished} of {result.operations_submitted} finished"
    assert "celery.app.trace" not in result.serve_output  # Celery's per-task lines stay in var/log/
    # The demo came alive by itself: trains visiting within a minute, an emergency train awaiting approval.
    assert result.first_visit_running_s is not None
    assert result.approvals_waiting >= 1
