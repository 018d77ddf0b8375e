"""Reading a refusal by its codes, never its wording (a decision must not depend on a message)."""

from __future__ import annotations

from django.core.exceptions import ValidationError


def refusal_codes(error: ValidationError) -> set[str]:
    """The codes of every message of a ValidationError, whether it is keyed by field or a list."""
    errors = [e for es in error.error_dict.values() for e in es] if hasattr(error, "error_dict") else error.error_list
    return {e.code for e in errors if e.code}
