"""Write the calibration study's tables in docs/lab-notes.md from `flowcore sts --json` runs, so
that the notes cannot drift from the runs they cite:

    python docs/calibration_tables.py docs/calibration-runs        # rewrites the marked sections

Every *.json in the folder is read (the commands that wrote them are listed in the notes); a
record's method is its calibration and settings (whitening's power and dim), its fit corpus
`target` or the STS-B train sentence file. The sections between `<!-- NAME:start -->` and
`<!-- NAME:end -->` (headline, per-dataset, wmean, auto, flow) are replaced; the rest of the page
is left as written.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "lab-notes.md"
DATASETS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")
POOLINGS = ("mean", "first-last-avg", "static-avg")
METHODS = ("raw", "whitening", "tempered γ=0.25", "tempered γ=0.3", "whitening-k128", "auto", "flow")
CORPORA = {"stsb-train.txt": "STS-B train sentences", "target": "target (each set's own sentences)"}


def method(record: dict) -> str:
    """The page's name of a record's calibration."""
    name = record["calibration"]
    if name == "none":
        return "raw"
    if name == "whitening":
        if record.get("whitening_dim"):
            return f"whitening-k{record['whitening_dim']}"
        power = record.get("whitening_power", 0.5)
        return "whitening" if power == 0.5 else f"tempered γ={power:g}"
    return name


def spearman(record: dict, aggregation: str) -> float:
    if aggregation == "all" or record.get("aggregation") == "single":
        return record["spearman"]
    return record[f"spearman_{aggregation}"]


def load(folder: Path) -> dict:
    """{(corpus, pooling, method): {dataset: record}}; the raw rows are shared by both corpora."""
    cells: dict = {}
    for path in sorted(folder.glob("*.json")):
        for record in json.loads(path.read_text(encoding="utf-8"))["results"]:
            name = method(record)
            corpora = CORPORA if name == "raw" else [Path(record["fit_corpus"]).name]
            for corpus in corpora:
                cells.setdefault((corpus, record["pooling"], name), {})[record["dataset"]] = record
    return cells


def average(row: dict, aggregation: str) -> float:
    return statistics.fmean(spearman(row[d], aggregation) for d in DATASETS)


def per_dataset(cells: dict) -> str:
    parts = []
    for corpus, title in CORPORA.items():
        for pooling in POOLINGS:
            rows = {name: cells[(corpus, pooling, name)] for name in METHODS if (corpus, pooling, name) in cells}
            best = {d: max(spearman(row[d], "all") for row in rows.values()) for d in DATASETS}
            best_avg = max(average(row, "all") for row in rows.values())
            parts += [f"**{pooling}, fit on {title}**", "",
                      "| method | " + " | ".join(DATASETS) + " | Avg. | worst Δ vs raw |",
                      "| --- |" + " ---: |" * (len(DATASETS) + 2)]
            raw = rows["raw"]
            for name, row in rows.items():
                values = [spearman(row[d], "all") for d in DATASETS]
                cells_ = [_bold(v, v >= best[d] - 5e-3) for v, d in zip(values, DATASETS)]
                worst = min(v - spearman(raw[d], "all") for v, d in zip(values, DATASETS))
                mean = average(row, "all")
                parts.append(f"| {name} | " + " | ".join(cells_) + f" | {_bold(mean, mean >= best_avg - 5e-3)} | "
                             f"{worst:+.2f} |")
            parts.append("")
    return "\n".join(parts)


def wmean_averages(cells: dict) -> str:
    lines = ["| fit corpus | pooling | " + " | ".join(METHODS) + " |", "| --- | --- |" + " ---: |" * len(METHODS)]
    for corpus, title in CORPORA.items():
        for pooling in POOLINGS:
            values = [average(cells[(corpus, pooling, name)], "wmean") if (corpus, pooling, name) in cells else None
                      for name in METHODS]
            best = max(v for v in values if v is not None)
            lines.append(f"| {title} | {pooling} | " + " | ".join(
                "n/a" if v is None else _bold(v, v >= best - 5e-3) for v in values) + " |")
    return "\n".join(lines)


def headline(cells: dict) -> str:
    corpus = "stsb-train.txt"
    lines = ["| pooling (7-set average) | raw | whitening | best tempered | auto | flow |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for pooling in POOLINGS:
        def avg(name):
            return average(cells[(corpus, pooling, name)], "all")

        tempered = max(("tempered γ=0.25", "tempered γ=0.3"), key=avg)
        values = {"raw": avg("raw"), "whitening": avg("whitening"), tempered: avg(tempered), "auto": avg("auto"),
                  "flow": avg("flow")}
        best = max(values.values())
        shown = [_bold(v, v >= best - 5e-3) + (f" ({name.split()[1]})" if name == tempered else "")
                 for name, v in values.items()]
        lines.append(f"| {pooling} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def auto_choices(cells: dict) -> str:
    lines = ["| fit corpus | pooling | " + " | ".join(DATASETS) + " |", "| --- | --- |" + " --- |" * len(DATASETS)]
    for corpus, title in CORPORA.items():
        for pooling in POOLINGS:
            row = cells[(corpus, pooling, "auto")]
            lines.append(f"| {title} | {pooling} | " + " | ".join(_choice(row[d]) for d in DATASETS) + " |")
    return "\n".join(lines)


def _choice(record: dict) -> str:
    signals = record["auto_signals"]
    chosen = "none" if record["auto_choice"] == "none" else f"whitening-{signals['dim']}"
    few = "*" if signals["sampled_rows"] < 4000 else ""
    return f"{chosen} ({signals['hubness']:.3f}{few})"


def flow_summary(cells: dict) -> str:
    flows = [record for (corpus, pooling, name), row in cells.items() if name == "flow" for record in row.values()]
    kept_start = sum(1 for r in flows if r["flow_selected_epoch"] == 0)
    stopped = sorted({r["flow_heldout_epochs"][-1] for r in flows})
    gaps = [abs(spearman(cells[(c, p, "flow")][d], "all") - spearman(cells[(c, p, "whitening")][d], "all"))
            for (c, p, name) in cells if name == "flow" for d in DATASETS]
    return (f"The default flow kept its whitening start in {kept_start} of {len(flows)} fits (7 sets × 3 poolings × "
            f"2 fit corpora) and stopped after {min(stopped):.2f}-{max(stopped):.2f} of an epoch: no held-out "
            f"evaluation of the trained flow beat the start. Its Spearman equals whitening's to within "
            f"{max(gaps):.3f} in every cell.")


def _bold(value: float, best: bool) -> str:
    return f"**{value:.2f}**" if best else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the folder of `flowcore sts --json` outputs")
    cells = load(parser.parse_args().runs)
    page = PAGE.read_text(encoding="utf-8")
    for name, text in (("headline", headline(cells)), ("per-dataset", per_dataset(cells)),
                       ("wmean", wmean_averages(cells)), ("auto", auto_choices(cells)), ("flow", flow_summary(cells))):
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(page):
            raise SystemExit(f"{PAGE}: no <!-- {name}:start --> ... <!-- {name}:end --> section")
        page = pattern.sub(lambda match: match.group(1) + text.rstrip("\n") + "\n" + match.group(2), page)
    PAGE.write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
