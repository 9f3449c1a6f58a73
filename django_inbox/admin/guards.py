"""What keeps hostile query strings from the admins' lists: payload filters for users who
may not see payloads, and NUL characters (the inbox's and the outbox's admins)."""

from __future__ import annotations

from typing import Any

import django
from django.core.exceptions import BadRequest
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest


def payload_lookup_allowed(
    admin_: Any, parent: Any, lookup: str, value: str, request: Any, fields: Any
) -> bool:
    """``lookup_allowed()`` of an admin whose ``fields`` (payloads, headers) only users with
    its ``has_view_payload_permission`` may see: a filter on them would tell the others
    whether a hidden value matches. ``parent`` is the admin's ``super()``."""
    if lookup.split(LOOKUP_SEP, 1)[0] in fields and (
        request is None or not admin_.has_view_payload_permission(request)
    ):
        return False
    if django.VERSION < (5, 0):  # lookup_allowed() takes the request since Django 5.0
        return bool(parent.lookup_allowed(lookup, value))
    return bool(parent.lookup_allowed(lookup, value, request))


def refuse_unstorable_query(request: HttpRequest) -> None:
    """A NUL in the query string can match no row, and PostgreSQL refuses it in a query:
    answer 400 instead of a server error."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            raise BadRequest("the query string contains a NUL character")
