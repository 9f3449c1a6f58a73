"""A health endpoint for load balancers and Kubernetes probes, from ``inbox_stats``'s numbers.

Add it to your URLs::

    from django_inbox.contrib.health import health_view

    urlpatterns = [path("health/inbox", health_view)]

``GET`` answers ``200`` with ``{"healthy": true, …}`` when no problem is found, ``503`` with
the problems otherwise, and ``503`` with ``"error"`` when the inbox table cannot be read.
``?ignore=dead,pending_age`` leaves those kinds of problem out (see ``inbox_stats --ignore``);
``?consumer=NAME`` checks one consumer. The body holds counts and ids, never a payload.
"""

from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ..services import PROBLEM_KINDS, collect


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    ignore = tuple(
        kind for kind in request.GET.get("ignore", "").split(",") if kind in PROBLEM_KINDS
    )
    try:
        stats = collect(consumer=request.GET.get("consumer") or None, ignore=ignore)
    except DatabaseError as exc:
        return JsonResponse(
            {"healthy": False, "error": f"cannot read the inbox table: {type(exc).__name__}"},
            status=503,
        )
    body = stats.as_dict()
    return JsonResponse(body, status=200 if stats.healthy else 503)
