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
:func:`digest_sql` (hand-written statements) or :class:`Identity` (the ORM, by
``InboxMessageQuerySet.identified``), and tests the two columns too. Other databases keep the
unique constraint on the two columns and compare them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Func, UUIDField

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
