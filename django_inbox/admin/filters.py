"""Changelist filters that never scan the table to list their choices."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .. import clock
from ..conf import inbox_settings
from ..models import ATTENTION_STATUSES, InboxMessage
from ..registry import registry
from ..services import known_consumers


class ExactFilter(admin.SimpleListFilter):
    """Rows whose field ``parameter_name`` equals the chosen value (an index probe). Its
    choices are the subclass's :meth:`offered`, and the chosen value if they lack it (a value
    given in the URL, beyond the rows the choices were read from)."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(self.offered(request, model_admin))
        value = self.value()
        if value:
            names.add(value)
        return [(name, name) for name in sorted(names)]

    def offered(self, request: HttpRequest, model_admin: Any) -> Any:
        raise NotImplementedError

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{str(self.parameter_name): value}) if value else queryset


class ConsumerFilter(ExactFilter):
    title = _("consumer")
    parameter_name = "consumer"

    def offered(self, request: HttpRequest, model_admin: Any) -> list[str]:
        return known_consumers()


#: The event type filter offers the types of this many of the newest dead and parked rows.
RECENT_ATTENTION = 1000


class EventTypeFilter(ExactFilter):
    title = _("event type")
    parameter_name = "event_type"

    def offered(self, request: HttpRequest, model_admin: Any) -> set[str]:
        consumer = request.GET.get(ConsumerFilter.parameter_name)
        names: set[str] = set()
        for name in registry.consumers(load=False) if not consumer else [consumer]:
            names.update(registry.event_types(name))
        # Event types of the newest dead and parked rows too, handled or not: the newest
        # RECENT_ATTENTION by id (the attention rows' id index, read backwards). A DISTINCT
        # over all of them read every one on each page, 100,000 after an outage.
        attention = InboxMessage.objects.using(inbox_settings.database).filter(
            status__in=ATTENTION_STATUSES
        )
        if consumer:
            attention = attention.filter(consumer=consumer)
        newest = attention.order_by("-pk").values_list("event_type", flat=True)
        names.update(newest[:RECENT_ATTENTION])
        return names


class ReceivedFilter(admin.SimpleListFilter):
    title = _("received")
    parameter_name = "received"
    WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("1h", _("Last hour")),
            ("24h", _("Last 24 hours")),
            ("7d", _("Last 7 days")),
            ("older", _("Older than 7 days")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        now = clock.now()
        if value in self.WINDOWS:
            return queryset.filter(received_at__gte=now - self.WINDOWS[value])
        if value == "older":
            return queryset.filter(received_at__lt=now - self.WINDOWS["7d"])
        return queryset
