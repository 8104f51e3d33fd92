"""The report of `flowcore sts`: the paper-style markdown table under an STS12–16 aggregation, the
published figures of the same protocol (`published_table`), what `auto` chose (`auto_lines`), the JSON."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from flowcore import defaults
from flowcore._fs import atomic_write, write_error
from flowcore.sts.data import DATASETS
from flowcore.sts.metrics import spearman_of

__all__ = ["AGGREGATIONS", "AGGREGATION_NOTES", "PUBLISHED", "Published", "auto_lines", "json_ready",
           "markdown_table", "number_cell", "published_table", "row_label", "write_json"]

AGGREGATIONS = ("all", "wmean", "mean")

AGGREGATION_NOTES = {
    "all": "STS12-16: subsets concatenated, one correlation (SBERT, SimCSE, MTEB)",
    "wmean": "STS12-16: size-weighted mean of per-subset correlations (BERT-flow, BERT-whitening)",
    "mean": "STS12-16: plain mean of per-subset correlations",
}

REPORTED = ("all", "wmean")
"""The aggregations `flowcore sts` prints a table for: the SBERT/SimCSE/MTEB one and the papers' one."""


@dataclass(frozen=True)
class Published:
    """A published row of Spearman ×100 (`spearman`, in `DATASETS` order), with the protocol it was measured under.

    Attributes:
        source: who published it, and where.
        models: the encoder's names (any spelling `flowcore sts --model` may be given, lower case).
        pooling: the flowcore pooling that computes the paper's sentence vector.
        aggregation: the STS12–16 aggregation (`AGGREGATIONS`).
        sick_split: the SICK-R pairs scored, "test" (4927) or "all" (9927).
        row: what the row is (the calibration and its fit corpus).
    """

    source: str
    models: tuple[str, ...]
    pooling: str
    aggregation: str
    sick_split: str
    row: str
    spearman: tuple[float, ...]


_BERT = ("bert-base-uncased", "google-bert/bert-base-uncased")
_MINILM = ("default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
_LI = "BERT-flow (Li et al. 2020), Table 2"
_SU = "BERT-whitening (Su et al. 2021)"
PUBLISHED = (
    Published(_LI, _BERT, "mean", "wmean", "test", "BERT-base (uncased), last-layer mean",
              (49.07, 55.92, 54.75, 62.75, 65.19, 47.29, 58.21)),
    Published(_LI, _BERT, "first-last-avg", "wmean", "test", "BERT-base (uncased), first+last layer mean",
              (57.84, 61.95, 62.48, 70.95, 69.81, 59.04, 63.75)),
    Published(_LI, _BERT, "first-last-avg", "wmean", "test", "BERT-base (uncased) first+last + flow (NLI sentences)",
              (59.54, 64.69, 64.66, 72.92, 71.84, 58.56, 65.44)),
    Published(_LI, _BERT, "first-last-avg", "wmean", "test", "BERT-base (uncased) first+last + flow (target)",
              (63.48, 72.14, 68.42, 73.77, 75.37, 70.72, 63.11)),
    Published(_SU, _BERT, "first-last-avg", "wmean", "test", "BERT-base (uncased) first+last + whitening (target)",
              (63.62, 73.02, 69.23, 74.52, 72.15, 71.34, 60.60)),
    Published(_SU, _BERT, "first-last-avg", "wmean", "test", "BERT-base (uncased) first+last + whitening-256 (target)",
              (63.89, 73.76, 69.08, 74.59, 74.40, 71.43, 62.20)),
    Published("MTEB", _MINILM, "mean", "all", "all", "all-MiniLM-L6-v2, mean pooling",
              (72.37, 80.60, 75.59, 85.39, 78.99, 82.03, 77.58)),
)
"""Published figures `flowcore sts` cites where the encoder, pooling and aggregation match (SICK-R split named)."""


def row_label(record: dict) -> str:
    """The table row of a record: model and pooling, then the calibration and its fit corpus."""
    label = f"{record['model']} {record['pooling']}"
    if record["calibration"] == "none":
        return label
    corpus = record.get("fit_corpus", "")
    corpus = corpus.split(" ")[0] if corpus.startswith(("target", "train")) else os.path.basename(corpus)
    detail = name = record["calibration"]
    if name == "whitening" and record.get("whitening_dim"):
        detail += f"-{record['whitening_dim']}"
    if name == "whitening" and record.get("whitening_power", defaults.WHITENING_POWER) != defaults.WHITENING_POWER:
        detail += f" power {record['whitening_power']:g}"
    if name == "abtt" and record.get("abtt_k"):
        detail += f"-{record['abtt_k']}"
    if record.get(f"{name}_input", "standardize") != "standardize":  # a calibration fitted on another input
        detail += f" on {record[f'{name}_input']} input"
    return f"{label} + {detail} ({corpus})"


def markdown_table(records: list[dict], aggregation: str = "all") -> str:
    """A paper-style table of Spearman ×100 (under `aggregation` for STS12–16): one row per model/pooling +
    calibration, one column per dataset (the built-in ones in their order, then your own pairs), and the average."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
    present = list(dict.fromkeys(r["dataset"] for r in records))
    columns = [d for d in DATASETS if d in present] + [d for d in present if d not in DATASETS]
    rows: dict[str, list[float | None]] = {}
    for record in records:
        cells = rows.setdefault(row_label(record), [None] * len(columns))
        cells[columns.index(record["dataset"])] = spearman_of(record, aggregation)
    return _table("encoder + calibration", columns, rows)


def _table(corner: str, columns: list[str], rows: dict[str, list]) -> str:
    """A markdown table of `rows` ({label: a cell per column}) and their average (n/a where one is)."""
    lines = [f"| {corner} | " + " | ".join(columns) + " | Avg. |",
             "| --- |" + " ---: |" * (len(columns) + 1)]
    for label, cells in rows.items():
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
    """`{...header, "results": [...]}` with NaN as null, written atomically (a link at `path` is replaced)."""
    document = {**header, "results": json_ready(records)}
    data = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        atomic_write(path, lambda stream: stream.write(data))
    except OSError as error:
        raise write_error(error, path, len(data)) from None


def published_table(records: list[dict], aggregation: str) -> str | None:
    """The `PUBLISHED` rows for the encoders and poolings of `records` under `aggregation`, as a markdown table with
    the same dataset columns, or None when none matches."""
    present = {r["dataset"] for r in records}
    columns = [d for d in DATASETS if d in present]
    encoders = {(_model_name(r["model"]), r["pooling"]) for r in records}
    sick = {r.get("split") for r in records if r["dataset"] == "SICK-R"}
    rows = {}
    for published in PUBLISHED:
        if published.aggregation != aggregation or not any(
                model in published.models and pooling == published.pooling for model, pooling in encoders):
            continue
        label = f"{published.source}: {published.row}"
        if "SICK-R" in columns and published.sick_split not in sick:
            label += f" (SICK-R: {'all 9927' if published.sick_split == 'all' else '4927 test'} pairs)"
        rows[label] = [published.spearman[DATASETS.index(d)] for d in columns]
    return _table("published, same protocol", columns, rows) if columns and rows else None


def _model_name(model: str) -> str:
    """A model as `PUBLISHED` names it: a Hub name or a local folder's name, lower case."""
    name = str(model).rstrip("/").lower()
    return name if name in {m for p in PUBLISHED for m in p.models} else os.path.basename(name)


def auto_lines(records: list[dict]) -> list[str]:
    """One line per encoder, pooling and fit corpus saying what `auto` chose on each dataset and the
    hubness it measured, e.g. "auto, default mean (train): none on all 7 datasets (hubness 0.238-0.241 < 0.265)"."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        if record["calibration"] == "auto" and record.get("auto_choice") is not None:
            groups.setdefault(row_label(record).replace(" + auto", "", 1), []).append(record)
    lines = []
    for label, chosen in groups.items():
        choices = {_choice(r) for r in chosen}
        hubness = [r["auto_signals"]["hubness"] for r in chosen]
        threshold = chosen[0]["auto_signals"]["threshold"]
        spread = f"{min(hubness):.3f}" + (f"-{max(hubness):.3f}" if max(hubness) - min(hubness) >= 5e-4 else "")
        if len(choices) == 1:
            relation = "<" if chosen[0]["auto_choice"] == "none" else "≥"
            lines.append(f"auto, {label}: {choices.pop()} on all {len(chosen)} datasets (hubness {spread} {relation} "
                         f"{threshold:g})")
        else:
            lines.append(f"auto, {label}: " + ", ".join(
                f"{r['dataset']} {_choice(r)} ({r['auto_signals']['hubness']:.3f})" for r in chosen)
                + f" (whitening where hubness ≥ {threshold:g})")
    return lines


def _choice(record: dict) -> str:
    return "none" if record["auto_choice"] == "none" else f"whitening-{record['auto_signals']['dim']}"
