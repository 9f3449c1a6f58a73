"""Writes bench/results/latest.json and latest.md (stub)."""

import json
from pathlib import Path


def write_report(results: Path, **data) -> str:
    results.mkdir(parents=True, exist_ok=True)
    (results / "latest.json").write_text(json.dumps(data, indent=2))
    return json.dumps(data["figures"], indent=1)
