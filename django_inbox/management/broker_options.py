"""The options of the commands that talk to a broker (``inbox_consume``, ``outbox_relay``):
how long to wait for it, and what is refused before it is tried (a URL that cannot be read, a
name AMQP cannot carry)."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from .base import MISCONFIGURED, seconds

#: The schemes a broker URL may have, as error messages say them.
SCHEMES_SAID = (
    "amqp://, redis://, redis+streams://, nats://, sqs://, sqs+native:// or filesystem://"
)
#: Schemes of the inbox's own transports (not kombu's), with the extra that installs each.
OWN_SCHEMES = {
    "nats": "nats",
    "redis+streams": "redis",
    "rediss+streams": "redis",
    "sqs+native": "sqs",
}

#: How long a broker that was never reached is tried before a command gives up.
WAIT_FOR_BROKER = 30.0


def add_wait_for_broker_option(parser: CommandParser) -> None:
    """``--wait-for-broker DURATION`` of ``inbox_consume`` and ``outbox_relay``."""
    parser.add_argument(
        "--wait-for-broker",
        type=seconds,
        default=WAIT_FOR_BROKER,
        metavar="DURATION",
        help=(
            "Give up with exit 2 if the broker cannot be reached within this long of "
            f"starting (default {WAIT_FOR_BROKER:.0f}s); 0 waits for ever. A broker lost "
            "after it was reached is always waited for."
        ),
    )


def checked_broker_url(url: str) -> str:
    """``url`` with its password masked; exit 2 if it names no transport kombu has, cannot be
    read (a port that is no number, a bracket left open) or needs a package not installed."""
    from kombu.connection import Connection

    scheme = url.split("://", 1)[0]
    if "://" not in url:  # kombu would take it for an AMQP host name
        raise CommandError(
            f"the broker URL has no scheme; use {SCHEMES_SAID}", returncode=MISCONFIGURED
        )
    if scheme.lower() in OWN_SCHEMES:
        return _checked_own_url(url, scheme)
    try:
        connection = Connection(url)  # type: ignore[no-untyped-call]
        connection.transport_cls  # noqa: B018 (resolving it finds an unknown scheme)
        masked = str(connection.as_uri())
        connection.transport  # noqa: B018
    except KeyError as exc:
        raise CommandError(
            f"unknown broker URL scheme {scheme!r} in --broker/INBOX_BROKER_URL ({exc}); use "
            f"{SCHEMES_SAID}",
            returncode=MISCONFIGURED,
        ) from None
    except ValueError as exc:
        raise CommandError(
            f"the {scheme}:// broker URL in --broker/INBOX_BROKER_URL cannot be read ({exc})",
            returncode=MISCONFIGURED,
        ) from None
    except ImportError as exc:
        raise CommandError(
            f"the broker URL needs a package that is not installed ({exc}); for Redis: pip "
            "install 'django-transactional-inbox[redis]', for SQS: '[sqs]'",
            returncode=MISCONFIGURED,
        ) from None
    return masked


def _checked_own_url(url: str, scheme: str) -> str:
    """A URL of one of the inbox's own transports (:data:`OWN_SCHEMES`), checked and masked."""
    from urllib.parse import urlsplit

    from ..broker.transports import transport_class
    from ..broker.transports.base import masked

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises)
    except ValueError as exc:
        raise CommandError(
            f"the {scheme}:// broker URL in --broker/INBOX_BROKER_URL cannot be read ({exc})",
            returncode=MISCONFIGURED,
        ) from None
    if not parts.hostname and scheme.lower() != "sqs+native":  # SQS: boto3's region
        raise CommandError(
            f"the {scheme}:// broker URL in --broker/INBOX_BROKER_URL names no host",
            returncode=MISCONFIGURED,
        )
    try:
        transport_class(url)
    except ImportError as exc:
        extra = OWN_SCHEMES[scheme.lower()]
        raise CommandError(
            f"the broker URL needs a package that is not installed ({exc}); pip install "
            f"'django-transactional-inbox[{extra}]'",
            returncode=MISCONFIGURED,
        ) from None
    return masked(url)


def amqp_name(option: str, value: str | None, *, empty: bool = True) -> None:
    """Exit 2 if ``value`` (a queue, exchange or routing key) is no name a broker takes: over
    255 bytes of UTF-8 (AMQP's short string), or empty where ``empty`` is false (a broker
    names an empty queue itself, and a durable one was left behind on every run)."""
    if value is None or (empty and value == ""):
        return
    if not value.strip():
        raise CommandError(f"{option} is empty.", returncode=MISCONFIGURED)
    if len(value.encode("utf-8", "surrogateescape")) > 255:
        raise CommandError(
            f"{option} is over 255 bytes of UTF-8, AMQP's limit for a name.",
            returncode=MISCONFIGURED,
        )
