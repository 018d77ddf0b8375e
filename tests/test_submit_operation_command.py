"""`manage.py submit_operation` submits what an operator may submit by hand, as the API's intent and
the console's form do: ad-hoc operations. Train and emergency operations are their trains', repair
ones the repair flow's own (they record no HostTask.downgrade_from, and other rules treat them
apart); the command used to submit any of them with `--source`."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from opsplanner.models import Event, Operation, OperationSource
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def submit(*args: str) -> str:
    out = StringIO()
    call_command("submit_operation", "--kind", "reboot", "--reason", "firmware settle", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("source", "whose"),
    [
        (OperationSource.TRAIN, "a maintenance train's"),
        (OperationSource.EMERGENCY, "an emergency train's, which a second operator approves"),
        (OperationSource.REPAIR, "the repair flow's own (failures, escalations, rollbacks)"),
    ],
)
def test_it_refuses_a_source_an_operator_may_not_submit_in_one_line_writing_nothing(source: str, whose: str) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    with pytest.raises(CommandError) as refused:
        submit("--scope", f"pool {pool.name}", "--source", source)

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "refused: an operator submits ad-hoc operations only, as through the API and the console: "
        f"{source} operations are {whose}"
    )
    assert not Operation.objects.exists()
    assert not Event.objects.filter(kind="operation.submitted").exists()


def test_it_submits_an_ad_hoc_operation_given_or_not() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    assert submit("--scope", f"pool {pool.name}").startswith("submitted operation #")
    assert submit("--scope", f"pool {pool.name}", "--source", "ad_hoc").startswith("submitted operation #")

    assert list(Operation.objects.values_list("source", flat=True)) == [OperationSource.AD_HOC] * 2


def test_it_refuses_a_repair_kind_as_the_api_and_the_form_do(capsys: pytest.CaptureFixture[str]) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    # argparse's one line, through the command line as an operator types it
    with pytest.raises(CommandError) as refused:
        call_command("submit_operation", "--kind", "repair", "--reason", "x", "--scope", f"pool {pool.name}")

    assert "invalid choice: 'repair'" in str(refused.value)
    assert not Operation.objects.exists()
