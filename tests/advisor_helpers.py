"""What the advisor's tests share: runs recorded instead of sent to the broker, a logged-in client,
and one run's section of the advisor page."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from opsplanner.models import AdvisorRun
from simulation import advisor_runs


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs handed to Celery after their commit (recorded here instead of sent to the broker)."""
    sent: list[int] = []
    monkeypatch.setattr(advisor_runs, "_enqueue", sent.append)
    return sent


def client_for(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def run_section(html: str, run: AdvisorRun) -> str:
    match = re.search(rf'<section id="advisor-run-{run.pk}".*?</section>', html, re.S)
    assert match, f"run #{run.pk} is not on the page"
    return match.group(0)
