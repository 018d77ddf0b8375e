"""Reading untyped document values with a place for every problem: the fleet file's type checks."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from fleet.versions import validate_version

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")
MAX_LABELS = 32
MAX_LABEL_TEXT = 253


@dataclass(frozen=True)
class Problem:
    place: str  # where in the document: hosts[1832].domain
    message: str

    def __str__(self) -> str:
        return f"{self.place}: {self.message}"


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", type(None): "empty"}.get(
        type(value), "a number"
    )


class Reader:
    """Collects problems; each read returns the value, or None after recording why not."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        # What the file declares under a valid name, even where other fields are wrong, so that a
        # reference to it is not reported as a second problem.
        self.pools: dict[str, set[str]] = {}  # pool -> domain names
        self.hostnames: set[str] = set()
        self.components: dict[str, tuple[str | None, set[str]]] = {}  # name -> (layer, versions)

    def add(self, place: str, message: str) -> None:
        self.problems.append(Problem(place, message))

    def mapping(self, value: Any, place: str, allowed: set[str], required: Iterable[str] = ()) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.add(place, f"expected a mapping, got {_kind(value)}")
            return None
        for key in value:
            if key not in allowed:
                self.add(f"{place}.{key}", f"unknown field (known: {', '.join(sorted(allowed))})")
        for key in required:
            if value.get(key) is None:
                self.add(f"{place}.{key}", "required")
        return value

    def sequence(self, value: Any, place: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(place, f"expected a list, got {_kind(value)}")
            return []
        return value

    def text(self, value: Any, place: str, max_length: int, *, blank: bool = False) -> str | None:
        if (
            type(value) is str
            and value.isascii()
            and len(value) <= max_length
            and "\x00" not in value
            and (blank or (value and not value.isspace()))
        ):
            return value  # the common case, checked once
        if value is None:
            return None  # a missing required field is reported by mapping()
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            hint = "; quote it, YAML read it as a number" if isinstance(value, float) else ""
            self.add(place, f"expected a string, got {_kind(value)}{hint}")
            return None
        if "\x00" in value:
            self.add(place, "contains a NUL character")
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            self.add(place, "is not valid UTF-8 text")
            return None
        if not blank and not value.strip():
            self.add(place, "must not be empty")
            return None
        if len(value) > max_length:
            self.add(place, f"at most {max_length} characters, not {len(value)}")
            return None
        return value

    def name(self, value: Any, place: str) -> str | None:
        text = self.text(value, place, 63)
        if text is not None and not NAME_RE.match(text):
            self.add(place, f"{text!r}: use lowercase letters, digits and dashes, starting with a letter or digit")
            return None
        return text

    def version(self, value: Any, place: str, *, blank: bool = False) -> str | None:
        text = self.text(value, place, 64, blank=blank)
        if not text:
            return text
        try:
            validate_version(text)
        except ValidationError as error:
            self.add(place, " ".join(error.messages))
            return None
        return text

    def integer(self, value: Any, place: str, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(place, f"expected a whole number, got {_kind(value)}")
            return None
        if not low <= value <= high:
            self.add(place, f"must be between {low} and {high}, not {value}")
            return None
        return value

    def boolean(self, value: Any, place: str) -> bool | None:
        if not isinstance(value, bool):
            self.add(place, f"expected true or false, got {_kind(value)}")
            return None
        return value

    def choice(self, value: Any, place: str, choices: list[str]) -> str | None:
        text = self.text(value, place, 64)
        if text is not None and text not in choices:
            self.add(place, f"{text!r} is not one of {', '.join(choices)}")
            return None
        return text

    def labels(self, value: Any, place: str) -> dict[str, Any] | None:
        """Free-form labels: up to 32 keys, each a string, a number or true/false."""
        if not isinstance(value, dict):
            self.add(place, f"expected a mapping, got {_kind(value)}")
            return None
        if len(value) > MAX_LABELS:
            self.add(place, f"at most {MAX_LABELS} labels, not {len(value)}")
            return None
        ok = True
        for key, item in value.items():
            if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
                self.add(f"{place}.{key}", "a label name: letters, digits and _.-/ (up to 63 characters)")
                ok = False
            elif (isinstance(item, float) and item != item) or (
                isinstance(item, float)
                and item
                in (
                    float("inf"),
                    float("-inf"),
                )
            ):
                self.add(f"{place}.{key}", "not a finite number")
                ok = False
            elif isinstance(item, str):
                ok = self.text(item, f"{place}.{key}", MAX_LABEL_TEXT, blank=True) is not None and ok
            elif not isinstance(item, bool | int | float) or (isinstance(item, int) and abs(item) >= 2**53):
                self.add(f"{place}.{key}", f"a label is a string, a number or true/false, not {_kind(item)}")
                ok = False
        return dict(value) if ok else None
