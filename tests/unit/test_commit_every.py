"""commit_every > 1: several messages per transaction, with the same exactly-once result."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing.worker import Worker
from tests.effects import lost_and_doubled

Status = InboxMessage.Status


def store_effects(ids: list[str], **payload_for: dict[str, object]) -> None:
    for message_id in ids:
        payload = payload_for.get(message_id.replace("-", "_"), {})
        assert store(
            consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
        )


@pytest.mark.django_db(transaction=True)
def test_batched_drain_with_failures_completes_each_message_once() -> None:
    ids = [f"m-{n:04d}" for n in range(500)]
    failing = {f"m_{n:04d}": {"fail_times": 1} for n in range(0, 500, 97)}
    store_effects(ids, **failing)

    stats = Worker(["effects"], commit_every=50, until_idle=1, poll_interval=0.02).run()

    lost, doubled = lost_and_doubled(set(ids))
    print(f"batched drain: {dict(stats.outcomes)} lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    rows = InboxMessage.objects.all()
    assert set(rows.values_list("status", flat=True)) == {Status.COMPLETED}
    retried = set(rows.filter(attempts=2).values_list("message_id", flat=True))
    assert retried == {key.replace("_", "-") for key in failing}
    assert rows.filter(attempts=1).count() == 500 - len(failing)


@override_settings(INBOX_CONSUMERS={"effects": {"commit_every": 0}})
def test_commit_every_must_be_positive() -> None:
    from django.core.checks import run_checks

    assert "django_inbox.E011" in {message.id for message in run_checks()}
