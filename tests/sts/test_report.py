"""The report: the paper-style markdown table under each aggregation, the published figures of the
same protocol beside it, what auto chose, and JSON with NaN as null."""
import json
import math

from flowcore.sts.report import auto_lines, markdown_table, published_table, write_json


def test_markdown_table_and_json(tmp_path):
    records = [
        {"dataset": "STS12", "calibration": "none", "pooling": "mean", "model": "m", "spearman": 70.0,
         "spearman_wmean": 60.0, "spearman_mean": 50.0, "aggregation": "all"},
        {"dataset": "STS-B", "calibration": "none", "pooling": "mean", "model": "m", "spearman": 80.0,
         "aggregation": "single"},
        {"dataset": "STS12", "calibration": "flow", "pooling": "mean", "model": "m", "spearman": math.nan,
         "fit_corpus": "target", "aggregation": "all"},
    ]
    table = markdown_table(records, "wmean").splitlines()
    assert table[0] == "| encoder + calibration | STS12 | STS-B | Avg. |"
    assert table[2] == "| m mean | 60.00 | 80.00 | 70.00 |"
    assert table[3] == "| m mean + flow (target) | n/a | n/a | n/a |"
    assert markdown_table(records).splitlines()[2] == "| m mean | 70.00 | 80.00 | 75.00 |"
    out = tmp_path / "r.json"
    write_json(records, out, seconds=1.5)
    document = json.loads(out.read_text())
    assert document["seconds"] == 1.5 and document["results"][2]["spearman"] is None
    assert document["results"][0]["spearman_wmean"] == 60.0


def test_row_labels_name_tempered_and_truncated_whitening():
    from flowcore.sts.report import row_label

    base = {"model": "m", "pooling": "mean", "calibration": "whitening", "fit_corpus": "target"}
    assert row_label({**base, "whitening_dim": None, "whitening_power": 0.5}) == "m mean + whitening (target)"
    assert row_label(base) == "m mean + whitening (target)"  # records written before the power was recorded
    assert row_label({**base, "whitening_dim": 128, "whitening_power": 0.25}) == \
        "m mean + whitening-128 power 0.25 (target)"


def _records(model, pooling, sick_split="test"):
    return [{"dataset": dataset, "calibration": "none", "pooling": pooling, "model": model, "spearman": 50.0,
             "split": sick_split if dataset == "SICK-R" else "test"} for dataset in ("STS12", "STS-B", "SICK-R")]


def test_published_figures_sit_beside_ours_where_the_protocol_matches():
    table = published_table(_records("bert-base-uncased", "first-last-avg"), "wmean").splitlines()
    assert table[0] == "| published, same protocol | STS12 | STS-B | SICK-R | Avg. |"
    assert table[2] == ("| BERT-flow (Li et al. 2020), Table 2: BERT-base (uncased), first+last layer mean | 57.84 | "
                        "59.04 | 63.75 | 60.21 |")
    assert any("+ flow (target) | 63.48 | 70.72 | 63.11 |" in line for line in table)
    assert any(line.startswith("| BERT-whitening (Su et al. 2021): BERT-base (uncased) first+last + whitening (target)")
               for line in table) and len(table) == 7
    assert published_table(_records("bert-base-uncased", "first-last-avg"), "all") is None  # the papers' is wmean
    assert "last-layer mean | 49.07 |" in published_table(_records("/models/bert-base-uncased/", "mean"), "wmean")
    minilm = published_table(_records("default", "mean"), "all").splitlines()
    assert minilm[2] == ("| MTEB: all-MiniLM-L6-v2, mean pooling (SICK-R: all 9927 pairs) | 72.37 | 82.03 | 77.58 | "
                         "77.33 |")
    assert "(SICK-R" not in published_table(_records("default", "mean", sick_split="all"), "all")
    assert published_table(_records("default", "first-last-avg"), "all") is None
    assert published_table(_records("roberta-base", "mean"), "wmean") is None


def test_auto_lines_say_what_auto_chose_on_each_dataset():
    def record(dataset, pooling, choice, hubness, corpus="train"):
        return {"dataset": dataset, "calibration": "auto", "pooling": pooling, "model": "m", "fit_corpus": corpus,
                "auto_choice": choice, "auto_signals": {"hubness": hubness, "threshold": 0.265, "dim": 199}}

    lines = auto_lines([record("STS12", "mean", "none", 0.2381), record("STS-B", "mean", "none", 0.2412),
                        record("STS12", "static-avg", "whitening", 0.31), record("STS-B", "static-avg", "none", 0.26),
                        {"dataset": "STS12", "calibration": "none", "pooling": "mean", "model": "m"}])
    assert lines == ["auto, m mean (train): none on all 2 datasets (hubness 0.238-0.241 < 0.265)",
                     "auto, m static-avg (train): STS12 whitening-199 (0.310), STS-B none (0.260) "
                     "(whitening where hubness ≥ 0.265)"]
