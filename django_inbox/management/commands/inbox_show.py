from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...models import InboxMessage
from ...services import find, shown_json
from ...wording import counted
from ..base import MISCONFIGURED, InboxCommand, require_known_consumers, text

#: Exit code when no message matched.
NOT_FOUND = 1


class Command(InboxCommand):
    help = (
        "Show messages by message id (in every consumer, or one) or row id: status, attempts, "
        "times, last error and the history of attempts and operator actions. Payloads and "
        "headers only with --payload. Exit codes: 0 found, 1 not found, 2 misconfigured."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "message_ids", nargs="*", type=text, metavar="MESSAGE_ID", help="Message id."
        )
        parser.add_argument("--consumer", default=None, help="Only this consumer's rows.")
        parser.add_argument(
            "--id", type=int, action="append", dest="pks", default=[], help="Row id; repeatable."
        )
        parser.add_argument("--json", action="store_true", help="Print JSON (for scripts).")
        parser.add_argument(
            "--payload",
            action="store_true",
            help="Also print payloads and headers (they may hold personal data).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["message_ids"] and not options["pks"]:
            raise CommandError("Give a MESSAGE_ID or --id.", returncode=MISCONFIGURED)
        require_known_consumers([options["consumer"]])
        found = find(
            message_ids=options["message_ids"], pks=options["pks"], consumer=options["consumer"]
        )
        if options["json"]:
            self.stdout.write(
                json.dumps([describe(m, options["payload"]) for m in found], indent=2, default=str)
            )
        else:
            for message in found:
                self.stdout.write(render(message, options["payload"]))
        if not found:
            raise CommandError("no such message", returncode=NOT_FOUND)


def describe(message: InboxMessage, payload: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": message.pk,
        "consumer": message.consumer,
        "message_id": message.message_id,
        "event_type": message.event_type,
        "source": message.source,
        "key": message.key,
        "sequence": message.sequence,
        "status": message.status,
        "attempts": message.attempts,
        "received_at": message.received_at,
        "updated_at": message.updated_at,
        "next_attempt_at": message.next_attempt_at,
        "locked_until": message.locked_until,
        "processed_at": message.processed_at,
        "last_error": message.last_error,
        "history": message.history,
    }
    if payload:
        data["payload"] = _showable(message.payload)
        data["headers"] = _showable(message.headers)
    return data


def _showable(value: Any) -> Any:
    """``value`` if it can be written as JSON here, else its text with why."""
    shown = shown_json(value)
    return value if shown.note is None else {"shown": shown.text, "why": shown.note}


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


def render(message: InboxMessage, payload: bool) -> str:
    lines = [
        f"{message.consumer} {message.message_id} (id {message.pk}): {message.status}, "
        f"{counted(message.attempts, 'attempt')}",
        f"  event type  {message.event_type}"
        + (f"   source {message.source}" if message.source else "")
        + (f"   key {message.key}" if message.key else "")
        + (f"   sequence {message.sequence}" if message.sequence is not None else ""),
        f"  received    {_when(message.received_at)}   updated {_when(message.updated_at)}",
        f"  next        {_when(message.next_attempt_at)}   processed {_when(message.processed_at)}",
    ]
    if message.last_error:
        lines.append(f"  last error  {message.last_error}")
    for entry in message.history:
        at = entry.get("at", "")[:19]
        if entry.get("kind") == "error":
            retry = f", retry at {entry['retry_at'][:19]}" if entry.get("retry_at") else ""
            lines.append(
                f"  {at}  attempt {entry.get('attempt')} -> {entry.get('outcome')}{retry}: "
                f"{entry.get('type')}: {entry.get('message', '')}"
            )
        elif entry.get("kind") == "suppressed":
            lines.append(
                f"  {at}  attempt {entry.get('attempt')}: suppressed {entry.get('function')} "
                f"x{entry.get('calls', 1)} (re-run)"
            )
        elif "by" not in entry:  # the inbox's own entries: interrupted, gap, past_gap
            kind, said = entry.get("kind"), str(entry.get("message") or entry.get("stored", ""))
            said = said.removeprefix(f"{kind}: ")  # a gap's message starts "gap: " already
            lines.append(f"  {at}  {kind}: {said}")
        else:
            reason = f": {entry['reason']}" if entry.get("reason") else ""
            lines.append(
                f"  {at}  {entry.get('kind')} by {entry.get('by')} via {entry.get('via')} "
                f"(was {entry.get('from')}){reason}"
            )
    if payload:
        lines.append("  payload     " + _json(message.payload))
        lines.append("  headers     " + _json(message.headers))
    return "\n".join(lines)


def _json(value: Any) -> str:
    """A stored value as JSON text; one this process cannot decode or write out, as it can."""
    shown = shown_json(value)
    return shown.text if shown.note is None else f"({shown.note}) {shown.text}"
