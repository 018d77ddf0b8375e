"""Bounds the database sets on numbers a request may carry: past them a request is a 400 naming the
field, never a 500 from PostgreSQL (ids are bigints, attempts small integers)."""

MAX_ID = 2**63 - 1
MAX_ATTEMPT = 32767
