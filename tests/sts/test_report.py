"""The report: the paper-style markdown table under each aggregation, and JSON with NaN as null."""
import json
import math

from flowcore.sts.report import markdown_table, write_json


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
