"""Errors of handlers to Sentry, where ``sentry-sdk`` is installed and initialised: each
failed attempt of a handler is captured once, where the inbox records it (after the rollback),
with the consumer, message id, event type and attempt as the event's ``inbox`` context and as
tags. Not a ``Reject``, ``Park`` or ``Retry`` the handler asked for, nor the inbox's own
interruptions (a lost database, a timeout of its own statements). Never the payload or the
headers: the frames' local variables, which Sentry sends by default, are left out of these
events (a handler's locals hold its message). Without Sentry, one check."""

from __future__ import annotations

import logging
from typing import Any

from .exceptions import HandlerOutcome

logger = logging.getLogger("django_inbox")
_sdk: Any = None  # sentry_sdk once looked for; False when absent


def _sentry() -> Any:
    global _sdk
    if _sdk is None:
        try:
            import sentry_sdk
        except ImportError:
            _sdk = False
        else:
            _sdk = sentry_sdk
    return _sdk


def handler_failed(exc: BaseException, message: Any) -> None:
    """Capture ``exc``, raised by ``message``'s handler, with the inbox's context. Never
    raises: a failure to report is logged, and the attempt's own failure stands."""
    if isinstance(exc, HandlerOutcome):
        return
    sentry = _sentry()
    if not sentry:
        return
    try:
        _capture(sentry, exc, message)
    except Exception:
        logger.warning("could not report a handler's failure to Sentry", exc_info=True)


def _capture(sentry: Any, exc: BaseException, message: Any) -> None:
    if not sentry.get_client().is_active():
        return
    about = {
        "consumer": message.consumer,
        "message_id": message.message_id,
        "event_type": message.event_type,
        "attempt": int(message.attempts or 0),
    }
    with sentry.new_scope() as scope:
        scope.set_context("inbox", about)
        scope.set_tag("inbox.consumer", message.consumer)
        scope.set_tag("inbox.event_type", message.event_type)
        scope.add_event_processor(_without_local_variables)
        sentry.capture_exception(exc)


def _without_local_variables(event: dict[str, Any], hint: Any) -> dict[str, Any]:
    """The frames' local variables left out (Sentry sends them by default): a handler's
    locals hold its message, and so its payload."""
    for value in (event.get("exception") or {}).get("values") or []:
        for frame in (value.get("stacktrace") or {}).get("frames") or []:
            frame.pop("vars", None)
    return event
