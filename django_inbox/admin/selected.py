"""What a confirmation page says of the selected messages, and who acts: the consumers' side
effect policies, where to return after an action started from a message's page, and the
actor written into each message's history."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

from ..conf import inbox_settings
from ..models import InboxMessage
from ..services import consumers_of


def side_effects(rows: QuerySet[InboxMessage]) -> list[tuple[str, bool, bool]]:
    """Per consumer of ``rows``: whether its re-runs suppress side effects, and whether it is
    ordered (what the force re-run confirmation tells the operator)."""
    consumers = consumers_of(rows)
    return [
        (
            consumer,
            inbox_settings.policy(consumer).suppresses_side_effects,
            inbox_settings.ordered(consumer),
        )
        for consumer in consumers
    ]


#: Messages a confirmation names; the rest are counted.
SAMPLE = 10


def return_to(request: HttpRequest, selected: QuerySet[Any]) -> int | None:
    """The message whose page an action came from (``_return_to``), if it is the one selected:
    where to go back to once the action ran. Anything else is ignored (no open redirect)."""
    value = request.POST.get("_return_to", "")
    if not re.fullmatch(r"[0-9]{1,18}", value):  # str.isdigit() takes "²" too
        return None
    pk = int(value)
    return pk if selected.filter(pk=pk).exists() else None


def actor_of(request: HttpRequest) -> str:
    user = request.user
    return f"{user.get_username()} (admin user {user.pk})"
