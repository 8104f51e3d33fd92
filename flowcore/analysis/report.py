"""The analysis report on disk: `analysis.json` (everything `analyze` measured), `summary.md` (the
tables, the advice, its warnings and the isotropy caveat) and the PNG figures, in one folder."""
from __future__ import annotations

from pathlib import Path

from flowcore._fs import atomic_write, atomic_write_json
from flowcore.analysis.figures import cosine_histogram_figure, frequency_figure, lexical_figure
from flowcore.sts.report import json_ready, number_cell

__all__ = ["JSON_NAME", "SUMMARY_NAME", "summary_markdown", "write_report"]

JSON_NAME = "analysis.json"
SUMMARY_NAME = "summary.md"


def write_report(analysis: dict, folder) -> dict[str, Path]:
    """Write `analysis` (from `analyze`) as JSON, markdown and PNG figures into `folder`.

    Args:
        analysis: the dict `flowcore.analysis.analyze` returns.
        folder: created if missing; existing files of the same names are replaced.

    Returns:
        {"json": path, "summary": path, "<figure name>": path, ...}.

    Example:
        >>> write_report(analyze(encoder=encoder, sentences=corpus), "analysis/")["summary"]
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    subject = " ".join(str(part) for part in (analysis.get("model"), analysis.get("pooling")) if part) or "vectors"
    paths: dict[str, Path] = {}
    if analysis["isotropy"]:
        paths["cosines"] = cosine_histogram_figure(analysis["isotropy"], folder / "cosines.png",
                                                   f"random-pair cosines, {subject}, {analysis['corpus']['name']}")
    if analysis["frequency"]:
        paths["frequency"] = frequency_figure(
            {source: entry["buckets"] for source, entry in analysis["frequency"].items()},
            folder / "frequency.png", f"token embeddings of {analysis.get('model')} by word frequency")
    for entry in analysis["pairs"]:
        name = "lexical-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in entry["dataset"])
        paths[name] = lexical_figure(entry["lexical_bias"], folder / f"{name}.png",
                                     f"similarity vs {entry['edit_unit']} edit distance, {entry['dataset']}")
    document = {**analysis, "figures": {name: path.name for name, path in paths.items()}}
    atomic_write_json(folder / JSON_NAME, json_ready(document), indent=2, ensure_ascii=False)
    summary = summary_markdown(document).encode("utf-8")
    atomic_write(folder / SUMMARY_NAME, lambda stream: stream.write(summary))
    return {"json": folder / JSON_NAME, "summary": folder / SUMMARY_NAME, **paths}


def summary_markdown(analysis: dict) -> str:
    """The short markdown summary of an analysis: isotropy, labelled pairs, frequency, advice."""
    subject = " ".join(str(part) for part in (analysis.get("model"), analysis.get("pooling")) if part) or "vectors"
    lines = [f"# Analysis: {subject} on {analysis['corpus']['name']} ({analysis['corpus']['rows']} vectors)", ""]
    lines += ["## Isotropy, before and after each calibration (fitted on the corpus, no labels)", "",
              "| calibration | mean random cosine | IsoScore | effective rank | top-1 PC variance | "
              "top-10 PC variance | p95 | p99 | p99.9 |",
              "| --- |" + " ---: |" * 8]
    for name, iso in analysis["isotropy"].items():
        shares, thresholds = iso["top_variance_share"], iso["thresholds"]
        lines.append(f"| {name} | {iso['mean_cosine']:.3f} | {iso['isoscore']:.3f} | {iso['effective_rank']:.1f} | "
                     f"{_share(shares.get('1'))} | {_share(shares.get('10'))} | {thresholds['p95']:.3f} | "
                     f"{thresholds['p99']:.3f} | {thresholds['p99.9']:.3f} |")
    lines += ["", "p95/p99/p99.9: percentiles of the random-pair cosines, suggested similarity thresholds (a pair "
              "above p99 is more similar than 99 % of random pairs of the corpus)."]
    lines += [f"- {name} failed: {entry['error']}" for name, entry in analysis["calibrations"].items()
              if "error" in entry]
    for entry in analysis["pairs"]:
        lines += ["", f"## {entry['dataset']} ({entry['n_pairs']} labelled pairs)", "",
                  f"| similarity | Spearman x100 with gold | Spearman x100 with {entry['edit_unit']} edit distance |",
                  "| --- | ---: | ---: |"]
        for name, bias in entry["lexical_bias"].items():
            gold = "(reference)" if name == "gold" else number_cell(entry["spearman"].get(name))
            lines.append(f"| {name} | {gold} | {number_cell(bias)} |")
    for source, entry in analysis["frequency"].items():
        knn = list(entry["buckets"][0]["knn_distance"]) if entry["buckets"] else []
        lines += ["", f"## Token embeddings by frequency rank ({source}; {entry['ranked_tokens']} ranked tokens)", "",
                  "| rank | tokens | mean l2 norm | " + " | ".join(f"mean {k}-NN distance" for k in knn) + " |",
                  "| --- |" + " ---: |" * (2 + len(knn))]
        for bucket in entry["buckets"]:
            cells = " | ".join(f"{bucket['knn_distance'][k]:.3f}" for k in knn)
            lines.append(f"| {bucket['start']}-{bucket['stop']} | {bucket['tokens']} | {bucket['mean_norm']:.3f} | "
                         f"{cells} |")
        lines.append(f"\nSpearman x100 of norm with frequency rank: {entry['norm_rank_spearman']:.2f}.")
    advice = analysis["advice"]
    lines += ["", "## Does calibration help?", "", advice["reason"]]
    lines += [f"\n**Warning:** {warning}" for warning in advice["warnings"]]
    lines += ["", f"*{analysis['caveat']}*", ""]
    return "\n".join(lines)


def _share(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"
