"""What keeps hostile query strings from the admins' lists: payload filters for users who
may not see payloads, and NUL characters (the inbox's and the outbox's admins)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import BadRequest, FieldDoesNotExist
from django.db import models
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
    if not plain_lookup(admin_.model, lookup):
        return False
    return bool(parent.lookup_allowed(lookup, value, request))


def refuse_unstorable_query(request: HttpRequest) -> None:
    """A NUL in the query string can match no row, and PostgreSQL refuses it in a query:
    answer 400 instead of a server error."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            raise BadRequest("the query string contains a NUL character")


#: Lookups a list's query string may use on a column: comparisons, none that can fail on a
#: value (``__year=0``, ``__regex=(((``, ``__range=1`` answered 500) or read every row by a
#: pattern the database cannot index (regular expressions).
PLAIN_LOOKUPS = frozenset(
    {
        "exact",
        "iexact",
        "in",
        "isnull",
        "gt",
        "gte",
        "lt",
        "lte",
        "contains",
        "icontains",
        "startswith",
        "istartswith",
        "endswith",
        "iendswith",
    }
)
#: On a JSON column every other name is a key (``payload__date`` is the key "date"), but for
#: these lookups of a key's value: a regular expression fails on a bad pattern, and reads
#: every row.
JSON_REFUSED = frozenset({"regex", "iregex"})


def plain_lookup(model: Any, lookup: str) -> bool:
    """Whether ``lookup`` (a query string's filter) is a column, or a path of keys in a JSON
    column, with at most one plain comparison: no transform, no regular expression. Refused
    ones answer 400 (Django's disallowed lookup)."""
    name, *rest = lookup.split(LOOKUP_SEP)
    try:
        field = model._meta.get_field("id" if name == "pk" else name)
    except FieldDoesNotExist:
        return True  # a list filter's own parameter, or refused by Django's own check
    if isinstance(field, models.JSONField):
        return not (JSON_REFUSED & set(rest)) and "" not in rest
    return not rest or (len(rest) == 1 and rest[0] in PLAIN_LOOKUPS)


def primary_key(text: str) -> int | None:
    """``text`` (an object id in a URL, a ``pk:`` search) as a row's primary key, or ``None``
    if no row can have it: ``isdigit()`` alone accepts "²", which ``int()`` refuses, and
    beyond a bigint no row can match."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    number = int(text)
    return number if number < 2**63 else None
