"""Version sort keys order versions as versions, not as strings."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleet.versions import version_sort_key


def test_sort_keys_order_versions_numerically_with_pre_releases_first() -> None:
    versions = ["560.35.03", "9.0", "535.183.01", "550.127.05", "560.35.03-rc1", "560.35.3.1", "1.0", "10.0"]
    ordered = sorted(versions, key=version_sort_key)
    assert ordered == ["1.0", "9.0", "10.0", "535.183.01", "550.127.05", "560.35.03-rc1", "560.35.03", "560.35.3.1"]


def test_trailing_zeros_do_not_change_the_order() -> None:
    assert version_sort_key("1.2") == version_sort_key("1.2.0")
    assert version_sort_key("1.2") < version_sort_key("1.2.1")


@pytest.mark.parametrize("bad", ["", "latest", "v1.2", "1..2", "1.2.3.4.5.6.7", "1.2-", "1.2 ", "1" * 10])
def test_it_refuses_strings_that_are_not_versions(bad: str) -> None:
    with pytest.raises(ValidationError, match="is not a version"):
        version_sort_key(bad)
