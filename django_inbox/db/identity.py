"""A message's identity on PostgreSQL: a 16-byte digest of ``(consumer, message_id)``.

The inbox deduplicates on ``(consumer, message_id)``. On PostgreSQL the unique index that
enforces it holds a digest of the pair instead of the pair itself (migration 0010,
``django_inbox_identity_idx``): the first 16 bytes of SHA-256 as a ``uuid``, 28 bytes per index
entry whatever the names' lengths, where the text pair took 56 to 72 for a consumer name and a
uuid-like message id. The digest is of ``length(consumer) || ':' || consumer || message_id``,
with each backslash doubled before the text becomes bytes (``::bytea`` reads ``\\`` as one), so
two different pairs always digest different texts; 128 bits of SHA-256 make two different
texts with one digest a practical impossibility (a table of 10^10 rows has a chance of about
10^-19 of holding one such pair).

A lookup by ``(consumer, message_id)`` finds the row through the index only if it compares this
same expression of the two columns, so every lookup by identity goes through
:func:`digest_sql` (hand-written statements) or :func:`identified` (the ORM: it compares
:class:`Identity`; ``InboxMessageQuerySet.identified`` and the forms of ``filter()`` that
:func:`identity_keywords` recognises come here), and tests the two columns too. Other
databases keep the unique constraint on the two columns and compare them.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from django.db import connections
from django.db.models import F, Func, Q, QuerySet, UUIDField, Value
from django.utils.functional import Promise

_Rows = TypeVar("_Rows", bound="QuerySet[Any]")

#: The unique index of the digests (PostgreSQL).
INDEX = "django_inbox_identity_idx"
#: An index of the consumers (PostgreSQL), few bytes per row as PostgreSQL stores a repeated key
#: once. It is built on ``consumer`` in the ``"C"`` collation, :data:`CONSUMER_SQL`, which only
#: statements that ask for it compare: listing consumers by a loose index scan, counting one
#: consumer's rows. A plain ``consumer = …`` cannot use it, so no plan trades a partial index of
#: the rows it wants (the claim's, the dead rows') for every row of a consumer.
CONSUMER_INDEX = "django_inbox_consumer_idx"
#: The indexed expression (byte order; equality is the same as in any deterministic collation).
CONSUMER_SQL = '("consumer" COLLATE "C")'


def digest_sql(consumer: str, message_id: str) -> str:
    """The digest of two SQL text expressions (``consumer`` appears twice in it: pass its
    parameters twice). The index is built on this expression of the two columns."""
    text = f"length({consumer}::text)::text || ':' || {consumer}::text || {message_id}::text"
    escaped = f"replace({text}, E'\\\\', E'\\\\\\\\')::bytea"
    return f"encode(substring(sha256({escaped}) FROM 1 FOR 16), 'hex')::uuid"


def digest_params(consumer: str, message_id: str) -> list[str]:
    """The parameters of ``digest_sql("%s", "%s")``."""
    return [consumer, consumer, message_id]


class Identity(Func):
    """``digest_sql`` of two expressions, for the ORM (PostgreSQL only)."""

    output_field = UUIDField()

    def as_sql(
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, tuple[Any, ...]]:
        consumer, message_id = (compiler.compile(arg) for arg in self.get_source_expressions())
        params = (*consumer[1], *consumer[1], *message_id[1])
        return digest_sql(consumer[0], message_id[0]), params


#: Above this many pairs a lookup compares the columns only: building and planning a list of
#: digests costs more than it saves (a second for 5,000 pairs).
MAX_DIGESTS = 1000


def identified(rows: _Rows, *pairs: tuple[str, str]) -> _Rows:
    """``rows`` whose ``(consumer, message_id)`` is one of ``pairs``. On PostgreSQL the
    lookup compares the digest the unique index holds (:mod:`django_inbox.db.identity`), so
    it reads the index (``filter()`` and ``get()`` with both as keywords come here too; a
    ``Q`` of the pair or an ``exclude()`` read the table there). Over :data:`MAX_DIGESTS`
    pairs it compares the columns only. No pairs, no rows."""
    if not pairs:
        return rows.none()
    by_consumer: dict[str, list[str]] = {}
    for consumer, message_id in pairs:
        by_consumer.setdefault(consumer, []).append(message_id)
    match = Q()
    for consumer, message_ids in by_consumer.items():
        match |= Q(consumer=consumer, message_id__in=message_ids)
    rows = rows.filter(match)
    if connections[rows.db].vendor != "postgresql" or len(pairs) > MAX_DIGESTS:
        return rows
    digests = [Identity(Value(consumer), Value(message_id)) for consumer, message_id in pairs]
    return rows.alias(inbox_identity=Identity(F("consumer"), F("message_id"))).filter(
        inbox_identity__in=digests
    )


_CONSUMER_KEYWORDS = ("consumer", "consumer__exact")
_ID_KEYWORDS = ("message_id", "message_id__exact")


def _text(value: Any) -> str | None:
    """``value`` as the text a lookup compares, if it is text (or a lazy string, a UUID)."""
    if isinstance(value, str):
        return value  # as it is: a str subclass's __str__ may say something else
    if isinstance(value, (Promise, uuid.UUID)):
        return str(value)
    return None


def identity_keywords(
    kwargs: dict[str, Any],
) -> tuple[list[tuple[str, str]], dict[str, Any]] | None:
    """The ``(consumer, message_id)`` pairs ``filter()``'s keywords ask for, and the other
    keywords; ``None`` if they name no consumer and message ids as plain values."""
    consumers = [name for name in _CONSUMER_KEYWORDS if name in kwargs]
    ids = [name for name in (*_ID_KEYWORDS, "message_id__in") if name in kwargs]
    if len(consumers) != 1 or len(ids) != 1:
        return None
    consumer = _text(kwargs[consumers[0]])
    if consumer is None:
        return None
    if ids[0] == "message_id__in":
        given = kwargs[ids[0]]
        if not isinstance(given, (list, tuple, set, frozenset)):
            return None  # a subquery, an expression: compared as written
        texts = [_text(value) for value in given]
    else:
        texts = [_text(kwargs[ids[0]])]
    if any(text is None for text in texts):
        return None
    others = {k: v for k, v in kwargs.items() if k not in (consumers[0], ids[0])}
    return [(consumer, text) for text in texts if text is not None], others
