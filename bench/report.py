"""Turn one benchmark run into ``bench/results/latest.json`` and ``latest.md``.

The "what limits it" lines are written from the numbers of the same run: wall time per
message split into client CPU, PostgreSQL backend CPU and the rest (round-trip latency,
commit flush, waiting for a core), round trips counted on the wire, and cProfile's view of
the client's Python time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report_consume import ConsumeAnalysis
from bench.report_limits import Limits
from bench.report_ratios import RatioTargets
from bench.report_tables import Tables


class Report(Tables, Limits, ConsumeAnalysis, RatioTargets):
    """The whole report: its tables, its limits, its consumer analysis, as Markdown."""

    # --------------------------------------------------------------------- documents

    def header(self) -> list[str]:
        facts = self.data["facts"]
        cfg = self.data["config"]
        pg = facts["postgresql_settings"]
        return [
            f"Command: `./scripts/bench` · {facts['date']} · {facts['bench_seconds']:.0f} s · "
            f"N={cfg['BENCH_N']} per run, {cfg['BENCH_RUNS']} runs (median), warm-up "
            f"{cfg['warmup']}, drain N={cfg['BENCH_DRAIN_N']} ({cfg['BENCH_DRAIN_RUNS']} runs), "
            f"pgbench {cfg['BENCH_PGBENCH_SECONDS']} s.",
            "",
            f"Machine: {facts['nproc']} cores ({facts['platform']}), load average "
            f"{facts['load_average_at_start']} at start and {facts['load_average_at_end']} at "
            "end (other work may share this machine and this PostgreSQL server: see the "
            f'"machine busy" column); {facts["postgresql"]}, fsync={pg.get("fsync")}, '
            f"synchronous_commit={pg.get('synchronous_commit')}, wal_sync_method="
            f"{pg.get('wal_sync_method')}, full_page_writes={pg.get('full_page_writes')}, "
            f"autovacuum={pg.get('autovacuum')} (the bench vacuums between runs), "
            f"shared_buffers={pg.get('shared_buffers')}; Python {facts['python']}, Django "
            f"{facts['django']}, psycopg {facts['psycopg']}; {facts['django_settings']}; "
            f"code measured: {facts.get('code', 'unknown')}.",
        ]

    def markdown(self) -> str:
        lines = [
            "# django-transactional-inbox benchmark",
            "",
            *self.header(),
            "",
            "## Targets",
            "",
            *self.targets_table(),
            "",
            "## Ratio targets (each against a baseline measured in the same run)",
            "",
            *self.ratio_targets_table(),
            "",
            *self.extra_sections(),
            "## What limits each figure",
            "",
            *self.limits(),
            "",
            "## Figures",
            "",
            *self.figures_table(),
            "",
            "Client CPU is the CPU time of the process running the inbox (this one, the "
            "inbox_process subprocesses, or the consumer subprocess of section 5, between its "
            "first and last message); server CPU is its PostgreSQL backend's, read from "
            '/proc in 10 ms ticks. "Machine busy" is every process on the machine: about 1 '
            "core is this benchmark, the rest is other work. pgbench rows are transactions/s, "
            'a transaction standing for a message. "Prepared statements" means Django '
            '`OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}`.',
            "",
            "## Ratios",
            "",
            *self.ratios_table(),
            "",
            "## Where the time goes",
            "",
            *self.time_table(),
            "",
            '"rest" is wall time neither process spent on a CPU: network latency, WAL flush '
            "at commit, waiting for a core.",
            "",
            "### Round trips, counted on the wire (libpq trace)",
            "",
            *self.round_trip_table(),
            "",
            "### cProfile (one profiled run each; the profiler inflates Python time)",
            "",
            *self.profile_section(),
            "",
            "### py-spy of the consumer processes (section 5; wall clock, `--idle`, 400 Hz)",
            "",
            *self.pyspy_section(),
            "",
        ]
        return "\n".join(lines)

    def extra_sections(self) -> list[str]:
        """Storage and dedup by table size, and the consumer's memory, when they ran."""
        lines: list[str] = []
        if self.data.get("scale"):
            from bench.scale import render_scale

            lines += [render_scale(self.data["scale"]), ""]
        if self.data.get("memory"):
            from bench.memory import render_memory

            lines += [render_memory(self.data["memory"]), ""]
        return lines

    def summary(self) -> str:
        return "\n".join(
            [
                *self.header(),
                "",
                *self.targets_table(),
                "",
                *self.ratio_targets_table(),
                "",
                *self.extra_sections(),
                *self.figures_table(),
                "",
                *self.ratios_table(),
                "",
                *self.limits(),
            ]
        )


def write_report(results: Path, **data: Any) -> str:
    """Write ``latest.json`` and ``latest.md`` into ``results``; return the text to print."""
    results.mkdir(parents=True, exist_ok=True)
    report = Report(data)
    (results / "latest.json").write_text(json.dumps(data, indent=2) + "\n")
    (results / "latest.md").write_text(report.markdown())
    return report.summary()
