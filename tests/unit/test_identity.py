"""A message's identity: ``(consumer, message_id)``, unique per consumer. On PostgreSQL the
unique index holds a digest of the pair (``db/identity.py``): these tests hold it to the pair's
meaning, for pairs a careless encoding of the two strings would confuse."""

from __future__ import annotations

import enum
import hashlib
import uuid

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext_lazy

from django_inbox.db import statements
from django_inbox.db.identity import digest_sql
from django_inbox.models import InboxMessage

pytestmark = pytest.mark.django_db

#: Pairs that naive encodings confuse, two by two: a plain concatenation of the two strings,
#: bytea's escapes (``\101`` is "A", ``\\`` one backslash, ``\x41`` hex), characters of several
#: bytes where a length in bytes would differ from one in characters.
CONFUSABLE = [
    (("ab", "c"), ("a", "bc")),
    (("orders", "a\\101b"), ("orders", "aAb")),
    (("orders", "x\\\\y"), ("orders", "x\\y")),
    (("orders", "\\x41"), ("orders", "A")),
    (("é", "x"), ("\u00c3\u00a9", "x")),
    (("1:a", "b"), ("1", ":ab")),
]


def store(consumer: str, message_id: str) -> bool:
    """The deduplicating insert itself (``deliver()``'s and ``store()``'s): ``True`` if new."""
    row = statements.NewRow(consumer=consumer, message_id=message_id, event_type="t", payload="{}")
    return statements.insert(row, timezone.now(), "default") is not None


def python_digest(consumer: str, message_id: str) -> uuid.UUID:
    text = f"{len(consumer)}:{consumer}{message_id}".encode()
    return uuid.UUID(bytes=hashlib.sha256(text).digest()[:16])


@pytest.mark.parametrize(("one", "other"), CONFUSABLE)
def test_confusable_pairs_are_two_messages(one: tuple[str, str], other: tuple[str, str]) -> None:
    for consumer, message_id in (one, other):
        assert store(consumer, message_id)
    for consumer, message_id in (one, other):  # and each is a duplicate of itself only
        assert not store(consumer, message_id)
        found = InboxMessage.objects.get(consumer=consumer, message_id=message_id)
        assert (found.consumer, found.message_id) == (consumer, message_id)
    assert InboxMessage.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.parametrize("pair", [pair for pairs in CONFUSABLE for pair in pairs])
def test_the_digest_is_sha256_of_the_length_prefixed_pair(pair: tuple[str, str]) -> None:
    """The SQL expression computes what its documentation says, so the encoding above is
    the one the index holds (the database is UTF-8)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {digest_sql('%s', '%s')}", [pair[0], pair[0], pair[1]])
        (found,) = cursor.fetchone()
    assert uuid.UUID(str(found)) == python_digest(*pair)


@pytest.mark.postgres
def test_the_unique_index_is_the_digests_and_the_pair_constraint_is_gone() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indisunique, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass "
            "AND i.indisunique AND NOT i.indisprimary",
            [InboxMessage._meta.db_table],
        )
        assert cursor.fetchall() == [("django_inbox_identity_idx", True, True)]


def test_identified_finds_each_pair_and_nothing_else() -> None:
    for consumer in ("a", "b"):
        for message_id in ("1", "2"):
            store(consumer, message_id)
    rows = InboxMessage.objects.identified(("a", "1"), ("b", "2"), ("c", "1"))
    assert sorted((r.consumer, r.message_id) for r in rows) == [("a", "1"), ("b", "2")]
    assert not InboxMessage.objects.identified().exists()
    # filter() with other conditions beside the pair keeps them
    assert InboxMessage.objects.filter(consumer="a", message_id="1", status="received").exists()
    assert not InboxMessage.objects.filter(consumer="a", message_id="1", status="dead").exists()
    assert InboxMessage.objects.filter(consumer="a").count() == 2


@pytest.mark.postgres
def test_the_index_postgresql_holds_is_the_one_the_lookups_compare() -> None:
    """Migration 0010 writes the index's SQL out; the code's lookups build it from
    ``digest_sql``. The two must be one expression, or every lookup by identity would read
    the table while the old expression kept deciding duplicates."""
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE identity_check (LIKE {table})")
        cursor.execute(
            "CREATE UNIQUE INDEX identity_check_idx ON identity_check "
            f"(({digest_sql('consumer', 'message_id')}))"
        )
        cursor.execute(
            "SELECT pg_get_indexdef('django_inbox_identity_idx'::regclass), "
            "pg_get_indexdef('identity_check_idx'::regclass)"
        )
        live, expected = cursor.fetchone()
        cursor.execute("DROP TABLE identity_check")
    assert live.split(" USING ", 1)[1] == expected.split(" USING ", 1)[1]


@pytest.mark.postgres
@pytest.mark.parametrize("insert", ["insert", "insert_or_status", "insert_completed"])
def test_a_conflict_on_another_unique_index_raises_instead_of_passing_for_a_duplicate(
    insert: str,
) -> None:
    """The inserts name their arbiter: a primary key taken (a sequence set back, as after a
    data-only restore) is an error, not a duplicate acknowledged and lost."""
    from django.db import IntegrityError, transaction

    assert store("orders", "first")
    taken = InboxMessage.objects.get(consumer="orders", message_id="first").pk
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s, false)", [taken]
        )
    row = statements.NewRow(consumer="orders", message_id="second", event_type="t", payload="{}")
    with pytest.raises(IntegrityError), transaction.atomic():
        if insert == "insert_completed":
            statements.insert_completed([row], timezone.now(), "default")
        else:
            getattr(statements, insert)(row, timezone.now(), "default")
    assert not InboxMessage.objects.filter(consumer="orders", message_id="second").exists()


@pytest.mark.postgres
def test_while_the_pair_constraint_is_there_any_unique_index_decides() -> None:
    """Between 0010 and 0011 both unique structures exist: an insert naming the digest index
    alone would meet a concurrent duplicate at the constraint as a unique violation. While
    the constraint is there the insert names no target; once it is gone, the digest index."""
    from django_inbox.db.statements import common

    row = statements.NewRow(consumer="orders", message_id="m", event_type="t", payload="{}")
    table = InboxMessage._meta.db_table
    saved_cache, saved_seen = dict(common.sql_cache), dict(common._pair_constraint)
    try:
        common.sql_cache.clear()
        common._pair_constraint.clear()
        assert store("orders", "m")
        assert "ON CONFLICT ((encode(" in "".join(common.sql_cache.values())
        with connection.cursor() as cursor:  # rolled back with the test
            cursor.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {common.PAIR_CONSTRAINT} "
                "UNIQUE (consumer, message_id)"
            )
        common.sql_cache.clear()
        common._pair_constraint.clear()
        assert statements.insert(row, timezone.now(), "default") is None  # a duplicate
        assert "ON CONFLICT  DO NOTHING" in "".join(common.sql_cache.values())
    finally:
        common.sql_cache.clear()
        common.sql_cache.update(saved_cache)
        common._pair_constraint.clear()
        common._pair_constraint.update(saved_seen)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "lookup",
    [
        {"consumer": "orders", "message_id": "m-1"},
        {"consumer__exact": "orders", "message_id__exact": "m-1"},
        {"consumer": "orders", "message_id__in": ["m-1", "m-2"]},
        {"consumer": "orders", "message_id": uuid.UUID(int=1)},
        {"consumer": gettext_lazy("orders"), "message_id": "m-1"},
    ],
    ids=["plain", "exact", "in", "uuid", "lazy"],
)
def test_every_keyword_form_of_the_pair_reads_the_digest_index(lookup: dict[str, object]) -> None:
    from tests.plans import explain, indexes

    sql, params = InboxMessage.objects.filter(**lookup).query.sql_with_params()
    with connection.cursor() as cursor:
        text = cursor.mogrify(sql, params)
        text = text.decode() if isinstance(text, bytes) else text
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # an empty table: ask for the index
        assert "django_inbox_identity_idx" in indexes(explain(text))


class Kind(str, enum.Enum):  # noqa: UP042 (a StrEnum prints its value: not this case)
    """A str subclass whose ``str()`` is not its value (``Kind.M1`` prints ``Kind.M1``)."""

    M1 = "m-1"


def test_keyword_forms_find_the_same_rows() -> None:
    store("orders", "m-1")
    store("orders", str(uuid.UUID(int=1)))
    rows = InboxMessage.objects
    assert rows.filter(consumer__exact="orders", message_id__exact="m-1").count() == 1
    assert rows.filter(consumer="orders", message_id__in=["m-1", "nope"]).count() == 1
    assert rows.filter(consumer="orders", message_id__in=[]).count() == 0
    assert rows.filter(consumer="orders", message_id=uuid.UUID(int=1)).count() == 1
    assert rows.filter(consumer=gettext_lazy("orders"), message_id="m-1").count() == 1
    assert rows.get(consumer="orders", message_id="m-1").message_id == "m-1"
    assert rows.filter(consumer="orders", message_id=Kind.M1).count() == 1
    assert rows.filter(consumer="orders", message_id__in=[Kind.M1]).count() == 1
    many = [f"x-{n}" for n in range(1500)] + ["m-1"]  # over MAX_DIGESTS: the columns decide
    assert rows.filter(consumer="orders", message_id__in=many).count() == 1
