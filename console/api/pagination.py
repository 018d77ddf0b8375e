"""Limit/offset for small tables; cursor pagination (stable under inserts, no COUNT) for the big ones."""

from __future__ import annotations

from rest_framework import pagination


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class IdCursorPagination(pagination.CursorPagination):
    """Newest first by id: hosts, host tasks, work items."""

    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


class AscendingIdCursorPagination(IdCursorPagination):
    ordering = "id"


class EventCursorPagination(IdCursorPagination):
    """Events newest first; id order is commit order closely enough and uses the primary key."""

    ordering = "-id"
