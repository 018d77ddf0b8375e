"""Component versions: validation and a sort key that orders versions correctly as plain strings.

Versions are dotted numbers with an optional pre-release suffix ("560.35.03", "12.4.1-rc2"). The
sort key pads every number and always has six parts, so comparisons can run in SQL on any database
("hosts running the GPU driver below 560") and a pre-release sorts before its release. SQL compares
the keys byte by byte: on PostgreSQL the column's collation is "C" whatever the database's locale
(fleet migration 0010: a locale that ignores punctuation put "1.0-rc1" after "1.0"); SQLite
compares text that way by default.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

VERSION_PATTERN = re.compile(r"^(\d{1,9})((?:\.\d{1,9}){0,5})(?:-([0-9A-Za-z][0-9A-Za-z.]{0,31}))?$")
MAX_VERSION_LENGTH = 64
SORT_KEY_LENGTH = 6 * 10 + 33
_PARTS = 6


def version_sort_key(version: str) -> str:
    """A string whose ordering is the version ordering. Raises ValidationError on a bad version."""
    match = VERSION_PATTERN.match(version or "")
    if match is None or len(version) > MAX_VERSION_LENGTH:
        raise ValidationError(
            f"{version!r} is not a version: use dotted numbers (up to six, e.g. 560.35.03) "
            "with an optional suffix such as -rc1",
            code="invalid_version",
        )
    numbers = [match.group(1)] + [part for part in match.group(2).split(".") if part]
    numbers += ["0"] * (_PARTS - len(numbers))
    padded = ".".join(f"{int(number):09d}" for number in numbers)
    suffix = match.group(3)
    # '!' sorts before '~', so 1.0-rc1 < 1.0 < 1.0.1.
    return f"{padded}!{suffix}" if suffix else f"{padded}~"


def validate_version(version: str) -> None:
    version_sort_key(version)
