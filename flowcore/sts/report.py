"""The report of `flowcore sts`: the paper-style markdown table (one row per encoder +
calibration, named by its row label) under one STS12–16 aggregation, and the JSON records."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from flowcore import defaults
from flowcore.sts.data import DATASETS
from flowcore.sts.metrics import spearman_of

__all__ = ["AGGREGATIONS", "AGGREGATION_NOTES", "json_ready", "markdown_table", "number_cell", "row_label",
           "write_json"]

AGGREGATIONS = ("all", "wmean", "mean")

AGGREGATION_NOTES = {
    "all": "STS12-16: subsets concatenated, one correlation (SBERT, SimCSE, MTEB)",
    "wmean": "STS12-16: size-weighted mean of per-subset correlations (BERT-flow, BERT-whitening)",
    "mean": "STS12-16: plain mean of per-subset correlations",
}


def row_label(record: dict) -> str:
    """The table row of a record: model and pooling, then the calibration and its fit corpus."""
    label = f"{record['model']} {record['pooling']}"
    if record["calibration"] == "none":
        return label
    corpus = record.get("fit_corpus", "")
    corpus = corpus.split(" ")[0] if corpus.startswith(("target", "train")) else os.path.basename(corpus)
    detail = record["calibration"]
    if record["calibration"] == "whitening" and record.get("whitening_dim"):
        detail += f"-{record['whitening_dim']}"
    if record["calibration"] == "whitening" and record.get("whitening_power", defaults.WHITENING_POWER) != \
            defaults.WHITENING_POWER:
        detail += f" power {record['whitening_power']:g}"
    if record["calibration"] == "abtt" and record.get("abtt_k"):
        detail += f"-{record['abtt_k']}"
    if record["calibration"] == "flow" and record.get("flow_input", "standardize") != "standardize":
        detail += f" on {record['flow_input']} input"
    return f"{label} + {detail} ({corpus})"


def markdown_table(records: list[dict], aggregation: str = "all") -> str:
    """A paper-style table: one row per model/pooling + calibration, one column per dataset (the
    built-in ones in their order, then your own pairs in theirs), then their average (Spearman
    ×100 under `aggregation` for STS12–16)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
    present = list(dict.fromkeys(r["dataset"] for r in records))
    columns = [d for d in DATASETS if d in present] + [d for d in present if d not in DATASETS]
    rows: dict[str, dict[str, float | None]] = {}
    for record in records:
        rows.setdefault(row_label(record), {})[record["dataset"]] = spearman_of(record, aggregation)
    lines = ["| encoder + calibration | " + " | ".join(columns) + " | Avg. |",
             "| --- |" + " ---: |" * (len(columns) + 1)]
    for label, values in rows.items():
        cells = [values.get(d) for d in columns]
        numbers = [v for v in cells if v is not None and not math.isnan(v)]
        average = sum(numbers) / len(numbers) if len(numbers) == len(columns) else None
        lines.append(f"| {label} | " + " | ".join(number_cell(v) for v in cells + [average]) + " |")
    return "\n".join(lines)


def number_cell(value) -> str:
    """A table cell: `value` to two decimals, "n/a" for None or NaN."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def json_ready(value):
    """NaN/Inf as null (valid JSON), tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def write_json(records: list[dict], path, **header) -> None:
    """`{"results": [...], ...header}` with NaN written as null (valid JSON)."""
    document = {**header, "results": json_ready(records)}
    # A plain write, not an atomic replace: --json may name a pipe or /dev/stdout.
    Path(path).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
