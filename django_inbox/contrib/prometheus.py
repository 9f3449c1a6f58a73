"""Prometheus metrics (``pip install django-transactional-inbox[prometheus]``).

Counters and a histogram are fed by the inbox's :mod:`signals <django_inbox.signals>` in each
process; gauges are read from the database when scraped (never while Django starts).
:func:`install` connects them; the app does it when it is ready if ``INBOX_METRICS`` is true
(check ``django_inbox.E015`` reports a missing ``prometheus_client``). Expose them with
:func:`metrics_view` in your URLs, or with ``--metrics-port`` of
``inbox_process`` / ``inbox_consume``, whose processes count the messages they handle.

Labels are bounded: ``consumer`` and ``event_type`` only take names your handlers are
registered for; any other event type (a hostile or misrouted message) is counted as ``other``.
``function`` (``inbox_side_effects_suppressed_total``) names ``@side_effect`` functions, which
your code defines.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import signals
from ..conf import inbox_settings
from ..registry import registry as handlers

OUTCOMES = {
    "processed": signals.message_processed,
    "failed": signals.message_failed,
    "dead": signals.message_dead,
    "parked": signals.message_parked,
    "duplicate": signals.message_duplicate,
    "received": signals.message_received,
    "replayed": signals.message_replayed,
    "reclaimed": signals.message_reclaimed,
    "skipped": signals.message_skipped,
    "waiting": signals.message_waiting,
}

_lock = threading.Lock()
# Keyed by the registry itself, which keeps it alive: keyed by ``id()``, a registry that was
# garbage collected would hand its id down to a new one, which would get the old metrics
# (registered on the dead registry) instead of its own.
_installed: dict[CollectorRegistry, Metrics] = {}
_with_gauges: dict[CollectorRegistry, StatsCollector] = {}


class Metrics:
    """The inbox's metric objects on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "inbox_messages",
            "Messages by consumer, event type and outcome (received, processed, failed, dead, "
            "parked, duplicate, replayed, reclaimed, skipped, waiting).",
            ["consumer", "event_type", "outcome"],
            registry=registry,
        )
        self.duplicates = Counter(
            "inbox_duplicates_skipped",
            "Deliveries of already completed messages, acknowledged without running a handler.",
            ["consumer", "event_type"],
            registry=registry,
        )
        self.processing = Histogram(
            "inbox_processing_seconds",
            "Time a handler ran, for attempts that completed or failed.",
            ["consumer", "event_type", "outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.suppressed = Counter(
            "inbox_side_effects_suppressed",
            "@side_effect calls that re-runs of completed messages did not make (consumers "
            "with side_effects_on_rerun='suppress'), by consumer and function.",
            ["consumer", "function"],
            registry=registry,
        )

    def suppressed_receiver(self, sender: Any, consumer: str, **kwargs: Any) -> None:
        consumer_label, _ = labels(consumer, "")
        function = str((kwargs.get("extra") or {}).get("function", "other"))
        self.suppressed.labels(consumer_label, function).inc()

    def receiver(self, outcome: str) -> Any:
        def receive(sender: Any, consumer: str, event_type: str, **kwargs: Any) -> None:
            consumer_label, label = labels(consumer, event_type)
            self.messages.labels(consumer_label, label, outcome).inc()
            if outcome == "duplicate":
                self.duplicates.labels(consumer_label, label).inc()
            duration = kwargs.get("duration")
            if duration is not None and outcome in ("processed", "failed", "dead", "parked"):
                self.processing.labels(consumer_label, label, outcome).observe(duration)

        return receive


def labels(consumer: str, event_type: str) -> tuple[str, str]:
    """Label values that only take known names, so hostile input cannot add time series."""
    known = consumer in handlers.consumers() or consumer in inbox_settings.consumers
    return (
        consumer if known else "other",
        event_type if handlers.get(consumer, event_type) is not None else "other",
    )


#: The gauges read from the database at scrape time: key, metric name, help.
GAUGES = {
    "pending": ("inbox_pending", "Messages still to process (received, failed, in progress)."),
    "in_progress": ("inbox_in_progress", "Messages a worker holds now."),
    "stuck": ("inbox_stuck", "Messages in progress past their lease (dead or hung worker)."),
    "dead": ("inbox_dead", "Dead messages waiting for an operator."),
    "parked": ("inbox_parked", "Parked messages waiting for an operator."),
    "age": (
        "inbox_oldest_pending_age_seconds",
        "How long the longest-waiting due message has waited for a worker.",
    ),
    "waiting": (
        "inbox_waiting",
        "Ordered consumers' messages waiting for an earlier sequence of their key.",
    ),
    "waiting_age": (
        "inbox_oldest_waiting_age_seconds",
        "How long the longest-waiting message of an ordered consumer has waited.",
    ),
    "parked_gaps": (
        "inbox_parked_gaps",
        "Ordered consumers' messages parked because a sequence never arrived.",
    ),
}


class StatsCollector(Collector):
    """Gauges read from the database at scrape time (``inbox_stats``'s numbers)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registering a collector without describe() makes prometheus_client call collect()
        # at once, which would query the database while Django starts (migrate included).
        yield from self._families().values()

    def _families(self) -> dict[str, GaugeMetricFamily]:
        return {
            key: GaugeMetricFamily(name, documentation, labels=["consumer"])
            for key, (name, documentation) in GAUGES.items()
        }

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from ..services import collect

        stats = collect()
        gauges = self._families()
        for name, consumer in sorted(stats.consumers.items()):
            gauges["pending"].add_metric([name], consumer.pending)
            gauges["in_progress"].add_metric([name], consumer.counts["in_progress"] or 0)
            gauges["stuck"].add_metric([name], consumer.stuck)
            gauges["dead"].add_metric([name], consumer.counts["dead"] or 0)
            gauges["parked"].add_metric([name], consumer.counts["parked"] or 0)
            gauges["age"].add_metric([name], consumer.oldest_pending_age)
            gauges["waiting"].add_metric([name], consumer.counts["waiting"] or 0)
            gauges["waiting_age"].add_metric([name], consumer.oldest_waiting_age)
            gauges["parked_gaps"].add_metric([name], consumer.parked_gaps)
        yield from gauges.values()
        if stats.outbox is not None:
            for name, documentation, value in (
                ("outbox_pending", "Outbox messages still to publish.", stats.outbox.pending),
                (
                    "outbox_oldest_pending_age_seconds",
                    "How long ago the oldest pending outbox message was written (relay lag).",
                    stats.outbox.oldest_pending_age,
                ),
                (
                    "outbox_dead",
                    "Outbox messages not published after their attempts.",
                    stats.outbox.dead,
                ),
            ):
                family = GaugeMetricFamily(name, documentation)
                family.add_metric([], value)
                yield family


def install(registry: CollectorRegistry = REGISTRY, *, gauges: bool = True) -> Metrics:
    """Create the metrics on ``registry`` and connect them to the signals; idempotent.

    ``gauges`` adds the collector that reads the database at scrape time: leave it off in
    workers, so a scrape of each worker does not query the database.
    """
    with _lock:
        metrics = _installed.get(registry)
        if metrics is None:
            metrics = _installed[registry] = Metrics(registry)
            for outcome, signal in OUTCOMES.items():
                signal.connect(
                    metrics.receiver(outcome),
                    dispatch_uid=f"django_inbox.prometheus.{id(registry)}.{outcome}",
                    weak=False,
                )
            signals.side_effect_suppressed.connect(
                metrics.suppressed_receiver,
                dispatch_uid=f"django_inbox.prometheus.{id(registry)}.suppressed",
                weak=False,
            )
        if gauges and registry not in _with_gauges:
            collector = _with_gauges[registry] = StatsCollector()
            registry.register(collector)
        return metrics


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition of the default registry: add it to your URLs, behind
    whatever protects internal endpoints."""
    install()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
