"""Cancelling an original while a withdrawal resubmits its work, in real threads on PostgreSQL: the
cancel read the original's resubmissions before the withdrawal committed one, then waited for the
pools the withdrawal holds; it reads them again once it holds them, so the new resubmission is
cancelled with it rather than left to run. The window is widened by a wait injected in the
withdrawal only, after it submitted the resubmission."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from opsplanner.models import Operation, OperationState, TaskState
from opsplanner.services import resubmission
from opsplanner.services.operation_cancel import operation_cancel
from tests.test_resubmissions_shown_and_cancelled import an_original_superseded_on_its_first_host
from tests.test_superseded_resubmitted import resubmissions_of, withdraw_n_plus_one
from tests.test_train_service_races import named_threads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancel_waiting_for_a_withdrawal_that_resubmits_the_original_cancels_the_resubmission_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wanted, _ = an_original_superseded_on_its_first_host()
    submitted = threading.Event()
    submit = resubmission._submit

    def submit_then_hold(*args: Any, **kwargs: Any) -> Operation:
        again = submit(*args, **kwargs)
        if threading.current_thread().name == "withdraw":
            submitted.set()
            time.sleep(1.0)  # the cancel reads the resubmissions meanwhile, then waits for the pools
        return again

    monkeypatch.setattr(resubmission, "_submit", submit_then_hold)

    def cancel() -> None:
        assert submitted.wait(10)
        operation_cancel(operation_id=wanted.pk, reason="2.16.0 is not wanted after all", actor="op")

    errors: list[BaseException] = []
    for thread in named_threads(errors, withdraw=withdraw_n_plus_one, cancel=cancel):
        thread.join(60)

    assert errors == []
    [again] = resubmissions_of(wanted)
    assert Operation.objects.get(pk=wanted.pk).state == OperationState.CANCELLED
    assert Operation.objects.get(pk=again.pk).state == OperationState.CANCELLED
    assert again.tasks.get().state == TaskState.CANCELLED
