"""What the viewsets share: the actor of a request, and reading ids the client sent."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from rest_framework import serializers

M = TypeVar("M", bound=Model)


def field_error(field: str, message: str) -> serializers.ValidationError:
    return serializers.ValidationError({field: message})


def get_or_field_error(queryset: QuerySet[M], field: str, pk: int, what: str) -> M:
    """The object with that id, or a 400 that names the field (an unknown id in a body is bad input)."""
    obj = queryset.filter(pk=pk).first()
    if obj is None:
        raise field_error(field, f"There is no {what} #{pk}.")
    return obj


def valid(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
