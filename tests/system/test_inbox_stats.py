"""``inbox_stats`` and ``django_inbox.services.collect``: counts per consumer and status, and the

The parts that run real processes; the rest is in ``tests/unit/test_services_stats.py``.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_inbox.registry import registry
from django_inbox.services import STATUSES
from tests.unit.test_services_stats import (
    Manage,
    Status,
    ago,
    counts,
    make_rows,
    run,
)


@pytest.mark.postgres
@pytest.mark.slow
def test_exit_0_when_healthy(manage: Manage) -> None:
    make_rows(Status.COMPLETED, 3)
    make_rows(Status.RECEIVED, 2)  # just arrived
    make_rows(Status.RECEIVED, 1, next_attempt_at=timezone.now() + timedelta(hours=1))
    make_rows(Status.FAILED, 1, next_attempt_at=timezone.now() + timedelta(hours=1))
    make_rows(Status.IN_PROGRESS, 1)  # lease still running

    code, out, err = run(manage)

    assert code == 0, (out, err)
    assert out.rstrip().endswith("healthy")
    assert err == ""


@pytest.mark.postgres
@pytest.mark.slow
def test_exit_1_on_a_dead_row_unless_ignored(manage: Manage) -> None:
    make_rows(Status.COMPLETED, 2)
    make_rows(Status.DEAD, 1, consumer="stream")

    code, out, err = run(manage)
    assert code == 1, (out, err)
    assert "PROBLEMS (1):" in out
    assert "stream: 1 dead message(s) need an operator" in out
    assert "1 problem(s) found" in err and "Traceback" not in err

    code, out, err = run(manage, "--ignore", "dead")
    assert code == 0, (out, err)


@pytest.mark.postgres
@pytest.mark.slow
def test_exit_1_on_a_stuck_row_unless_ignored(manage: Manage) -> None:
    make_rows(Status.IN_PROGRESS, 1)  # alive
    make_rows(Status.IN_PROGRESS, 1, next_attempt_at=ago(minutes=1))  # its worker died

    code, out, err = run(manage, "--json")
    assert code == 1, (out, err)
    report = json.loads(out)
    assert [(p["kind"], p["consumer"], p["value"]) for p in report["problems"]] == [
        ("stuck", "effects", 1)
    ]
    assert report["consumers"]["effects"]["stuck"] == 1

    code, out, err = run(manage, "--ignore", "stuck")
    assert code == 0, (out, err)


@pytest.mark.postgres
@pytest.mark.slow
def test_exit_1_when_a_due_row_waited_too_long(manage: Manage) -> None:
    make_rows(Status.RECEIVED, 1, next_attempt_at=ago(hours=1), received_ago=timedelta(hours=1))
    make_rows(Status.RECEIVED, 5)

    code, out, err = run(manage)
    assert code == 1, (out, err)
    assert "effects: a due message has waited" in out

    code, out, err = run(manage, "--max-pending-age", "30m")
    assert code == 1, (out, err)
    code, out, err = run(manage, "--max-pending-age", "2h")
    assert code == 0, (out, err)
    code, out, err = run(manage, "--ignore", "pending_age")
    assert code == 0, (out, err)


@pytest.mark.postgres
@pytest.mark.slow
def test_exit_2_on_a_system_check_error(manage: Manage) -> None:
    make_rows(Status.DEAD, 1)  # a problem too: misconfiguration wins
    code, out, err = run(manage, env={"INBOX_MAX_PAYLOAD_BYTES": "0"})
    assert code == 2, (out, err)
    assert "django_inbox.E007" in err
    assert "Traceback" not in err


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize(
    ("database", "says"),
    [
        ("does_not_exist_xyz", 'database "does_not_exist_xyz" does not exist'),
        # The server's maintenance database: reachable, but without the inbox table.
        ("postgres", 'relation "django_inbox_inboxmessage" does not exist'),
    ],
)
def test_exit_2_when_the_database_or_table_is_missing(
    manage: Manage, database: str, says: str
) -> None:
    settings = connection.settings_dict
    url = (
        f"postgres://{settings.get('USER') or 'postgres'}@{settings.get('HOST') or '127.0.0.1'}:"
        f"{settings.get('PORT') or 5432}/{database}"
    )
    code, out, err = run(manage, env={"DATABASE_URL": url})
    assert code == 2, (out, err)
    assert "cannot read the inbox table" in err
    assert says in err
    assert "are migrations applied?" in err
    assert "Traceback" not in err
    assert out == ""


@pytest.mark.postgres
@pytest.mark.slow
def test_json_output_counts_every_consumer_and_status(manage: Manage) -> None:
    make_rows(Status.COMPLETED, 4)
    make_rows(Status.RECEIVED, 2, next_attempt_at=timezone.now() + timedelta(hours=1))
    make_rows(Status.FAILED, 1, next_attempt_at=timezone.now() + timedelta(hours=1))
    make_rows(Status.PARKED, 2)
    make_rows(Status.COMPLETED, 1, consumer="stream")
    make_rows(Status.DEAD, 3, consumer="stream")
    make_rows(Status.IN_PROGRESS, 1, consumer="stream")
    make_rows(
        Status.RECEIVED,
        1,
        consumer="unregistered-consumer",
        next_attempt_at=timezone.now() + timedelta(hours=1),
    )

    code, out, err = run(manage, "--json")

    assert code == 1, (out, err)  # the dead rows
    report = json.loads(out)
    assert {"healthy", "problems", "totals", "consumers"} <= report.keys()
    assert report["healthy"] is False
    assert [(p["kind"], p["consumer"], p["value"]) for p in report["problems"]] == [
        ("dead", "stream", 3)
    ]
    consumers = report["consumers"]
    assert consumers["effects"]["counts"] == counts(completed=4, received=2, failed=1, parked=2)
    assert consumers["effects"]["pending"] == 3
    assert consumers["stream"]["counts"] == counts(completed=1, dead=3, in_progress=1)
    assert consumers["unregistered-consumer"]["counts"] == counts(received=1)
    for name in registry.consumers():  # consumers with handlers are listed, rows or not
        assert name in consumers
    assert consumers["audit"]["counts"] == counts()
    assert report["totals"] == counts(
        completed=5, received=3, failed=1, parked=2, dead=3, in_progress=1
    )
    assert report["completed_estimated"] is False
    assert all(c["oldest_pending_age"] == 0 for c in consumers.values()), "nothing is due"


@pytest.mark.postgres
@pytest.mark.slow
def test_human_table_lists_each_consumer(manage: Manage) -> None:
    make_rows(Status.COMPLETED, 1234)
    make_rows(Status.PARKED, 1, consumer="stream")

    code, out, err = run(manage)

    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0].split() == ["consumer", *STATUSES, "stuck", "oldest", "due"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.strip()}
    for name in [*registry.consumers(), "(all)"]:
        assert name in rows, name
    assert rows["effects"][STATUSES.index("completed")] == "1,234"
    assert rows["stream"][STATUSES.index("parked")] == "1"
    assert rows["(all)"][: len(STATUSES)] == [
        {"completed": "1,234", "parked": "1"}.get(status, "0") for status in STATUSES
    ]
