"""Small template filters for the inbox's admin pages."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from ..admin.render import status_badge as render_status_badge

register = template.Library()


@register.filter
def thousands(value: int | None) -> str:
    """``12345`` → ``12,345``."""
    return "" if value is None else f"{int(value):,}"


@register.filter
def seconds_short(value: float | None) -> str:
    """A duration in seconds, short: ``-``, ``42s``, ``3.5m``, ``2.0h``, ``1.5d``."""
    if not value or value <= 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}s"


@register.filter
def status_badge(value: str) -> SafeString:
    return render_status_badge(value)
