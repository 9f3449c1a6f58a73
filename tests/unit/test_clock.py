"""The inbox's clock (:mod:`django_inbox.clock`) against the test database's, on each database
family: a host clock in step is left alone; one that is minutes off is corrected, and the
correction is measured again when the host's clock moves."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_inbox import clock

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    clock.forget()
    yield
    clock.forget()


def shift(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = timezone.now

    def shifted() -> datetime:
        return real() + timedelta(seconds=seconds)

    monkeypatch.setattr(timezone, "now", shifted)


def test_a_clock_in_step_with_the_database_is_left_alone() -> None:
    assert abs(clock.measure("default")) < clock.TOLERANCE
    assert clock.synchronise("default") == 0.0
    assert clock.offset() == 0.0


def test_a_clock_minutes_off_is_corrected(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = timezone.now
    shift(monkeypatch, 240)
    with caplog.at_level(logging.WARNING, logger="django_inbox"):
        applied = clock.synchronise("default")
    if connection.vendor == "sqlite":
        assert applied == 0.0  # a file on this host: the host's clock is the database's
        return
    assert -241 < applied < -239
    assert abs((clock.now() - real()).total_seconds()) < 1
    assert "clock is 240" in caplog.text and "ahead of the database's" in caplog.text
    # The host's clock is set right: the next measurement takes the correction back.
    monkeypatch.setattr(timezone, "now", real)
    assert clock.synchronise("default") == 0.0
    assert abs((clock.now() - real()).total_seconds()) < 1


def test_refresh_measures_again_only_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    clock.refresh("default")
    measured: list[str] = []
    monkeypatch.setattr(clock, "synchronise", lambda using: measured.append(using))
    clock.refresh("default")
    assert measured == []
    monkeypatch.setattr(clock, "_measured_at", -clock.REFRESH * 2)
    clock.refresh("default")
    assert measured == ["default"]
