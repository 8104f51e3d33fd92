"""STS loaders: the real test sets load completely, and bad files fail naming file and line."""
import numpy as np
import pytest

from flowcore.sts.data import (
    DATASETS,
    STSDataError,
    default_data_dir,
    fit_corpus_sentences,
    load_split,
    load_test,
    read_sentence_file,
    semeval_pairs,
    splits,
)

TEST_PAIRS = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
              "STS-B": 1379, "SICK-R": 4927}


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_test_set_loads_completely(sts_data_dir, dataset):
    pairs = load_test(sts_data_dir, dataset)
    assert len(pairs) == TEST_PAIRS[dataset]
    assert len(pairs.sentences1) == len(pairs.sentences2) == len(pairs.subsets) == len(pairs)
    assert all(s.strip() for s in pairs.sentences1 + pairs.sentences2)
    assert not any("\t" in s or "\n" in s or "\r" in s for s in pairs.sentences1 + pairs.sentences2)
    low, high = (1, 5) if dataset == "SICK-R" else (0, 5)
    assert pairs.scores.min() >= low and pairs.scores.max() <= high and np.isfinite(pairs.scores).all()


def test_subsets_and_other_splits(sts_data_dir):
    sts16 = load_test(sts_data_dir, "STS16")
    assert list(dict.fromkeys(sts16.subsets)) == ["answer-answer", "headlines", "plagiarism", "postediting",
                                                  "question-question"]
    assert [len(load_split(sts_data_dir, "STS-B", s)) for s in splits("STS-B")] == [5749, 1500, 1379]
    assert [len(load_split(sts_data_dir, "SICK-R", s)) for s in splits("SICK-R")] == [4500, 500, 4927]
    assert len(load_test(sts_data_dir, "SICK-R", sick_split="all")) == 9927
    assert splits("STS13") == ("test",)


def test_stsb_quotes_are_text_and_utf8_is_kept(sts_data_dir):
    pairs = load_test(sts_data_dir, "STS-B")
    assert sum('"' in s for s in pairs.sentences1 + pairs.sentences2) > 0
    headlines = load_test(sts_data_dir, "STS15")
    assert any(not s.isascii() for s in headlines.sentences1 + headlines.sentences2)


def test_target_and_train_fit_corpora(sts_data_dir):
    label, sentences = fit_corpus_sentences(sts_data_dir, "STS-B", "target")
    assert label == "target" and len(sentences) == 2 * (5749 + 1500 + 1379)
    label, sentences = fit_corpus_sentences(sts_data_dir, "SICK-R", "train")
    assert label == "train" and len(sentences) == 2 * 4500
    label, sentences = fit_corpus_sentences(sts_data_dir, "STS13", "train")
    assert label == "train (no train split: target)" and len(sentences) == 2 * 1500


def _semeval(folder, inputs: str, gold: str, dataset="STS13"):
    test = folder / f"{dataset}-en-test"
    test.mkdir(parents=True)
    for subset in ("FNWN", "headlines", "OnWN"):
        (test / f"STS.input.{subset}.txt").write_text(inputs, encoding="utf-8")
        (test / f"STS.gs.{subset}.txt").write_text(gold, encoding="utf-8")
    return test


def test_semeval_layout_skips_unscored_and_ignores_extra_columns(tmp_path):
    _semeval(tmp_path, "Ça va\tÇa va bien\tsource a\tsource b\nunscored\tpair\nx\ty\n", "4.2\n\n1\n")
    pairs = load_test(tmp_path, "STS13")
    assert len(pairs) == 6
    assert pairs.sentences1[:2] == ["Ça va", "x"] and pairs.sentences2[:2] == ["Ça va bien", "y"]
    assert pairs.scores[:2].tolist() == [4.2, 1.0]
    assert pairs.subsets == ["FNWN"] * 2 + ["headlines"] * 2 + ["OnWN"] * 2


def test_stsb_line_with_quote_is_not_merged(tmp_path):
    folder = tmp_path / "STSBenchmark"
    folder.mkdir()
    (folder / "sts-test.csv").write_text(
        'main-news\theadlines\t2015\t0001\t2.5\tHe said "stop\tno quote here\n'
        "main-news\theadlines\t2015\t0002\t4\tnext\tline\textra\tcolumns\n", encoding="utf-8")
    pairs = load_split(tmp_path, "STS-B", "test")
    assert pairs.sentences1 == ['He said "stop', "next"] and pairs.sentences2 == ["no quote here", "line"]
    assert pairs.scores.tolist() == [2.5, 4.0]


@pytest.mark.parametrize("inputs, gold, message", [
    ("a\tb\nonly one column\n", "1\n2\n", "STS.input.FNWN.txt:2: expected two tab-separated sentences"),
    ("a\tb\nc\td\n", "1\nfive\n", "STS.gs.FNWN.txt:2: gold score 'five' is not a number"),
    ("a\tb\nc\td\n", "1\n", "has 2 lines but"),
    ("a\t \n", "1\n", "STS.input.FNWN.txt:1: sentence in column 2 is empty"),
])
def test_malformed_semeval_file_is_named_with_its_line(tmp_path, inputs, gold, message):
    _semeval(tmp_path, inputs, gold)
    with pytest.raises(STSDataError, match=message.replace(".", r"\.")):
        load_test(tmp_path, "STS13")


def test_malformed_stsb_sick_and_encoding_errors_name_file_and_line(tmp_path):
    (tmp_path / "STSBenchmark").mkdir()
    (tmp_path / "STSBenchmark" / "sts-test.csv").write_text("g\tf\t2015\t1\t3\tonly sentence one\n")
    with pytest.raises(STSDataError, match=r"sts-test\.csv:1: expected at least 7"):
        load_test(tmp_path, "STS-B")
    (tmp_path / "SICK").mkdir()
    (tmp_path / "SICK" / "SICK_test_annotated.txt").write_text("1\ta\tb\t3\tNEUTRAL\n")
    with pytest.raises(STSDataError, match=r"SICK_test_annotated\.txt:1: expected the SICK header"):
        load_test(tmp_path, "SICK-R")
    (tmp_path / "SICK" / "SICK_test_annotated.txt").write_bytes(
        b"pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n1\ta\tb\t3\tX\n2\t\xff\tb\t3\tX\n")
    with pytest.raises(STSDataError, match=r"SICK_test_annotated\.txt:3: not valid UTF-8"):
        load_test(tmp_path, "SICK-R")


def test_missing_files_and_folders_are_named(tmp_path):
    with pytest.raises(STSDataError, match=r"missing file: .*STS12-en-test.*STS\.input\.MSRpar\.txt"):
        load_test(tmp_path, "STS12")
    with pytest.raises(STSDataError, match="STS data folder not found"):
        load_test(tmp_path / "nowhere", "STS-B")
    with pytest.raises(STSDataError, match="unknown dataset 'STS17'"):
        load_test(tmp_path, "STS17")
    with pytest.raises(STSDataError, match="STS-B has no 'trial' split"):
        load_split(tmp_path, "STS-B", "trial")


def test_data_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWCORE_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    from flowcore.cli import build_parser

    assert build_parser().parse_args(["sts"]).data_dir == str(tmp_path)
    monkeypatch.delenv("FLOWCORE_DATA")
    with pytest.raises(STSDataError, match="pass --data-dir or set FLOWCORE_DATA"):
        default_data_dir()


def test_sentence_file_skips_blank_lines_and_rejects_empty(tmp_path):
    corpus = tmp_path / "nli.txt"
    corpus.write_text("A man sleeps.\n\n  A dog runs. \r\n", encoding="utf-8")
    assert read_sentence_file(corpus) == ["A man sleeps.", "A dog runs."]
    corpus.write_text("\n\n")
    with pytest.raises(STSDataError, match="no sentences"):
        read_sentence_file(corpus)


def test_semeval_pairs_reports_bad_lines_to_on_bad_and_goes_on(tmp_path):
    inputs, gold = tmp_path / "STS.input.x.txt", tmp_path / "STS.gs.x.txt"
    inputs.write_bytes(b"a\tb\none column\nc\t \nd\te\nf\tg\n\xff\th\nunscored\tpair\n")
    gold.write_bytes(b"1\n2\n3\nnan\n4\n5\n\n")
    bad = []
    pairs = list(semeval_pairs(inputs, gold, lambda path, number, message: bad.append((path, number, message))))
    assert pairs == [("a", "b", 1.0), ("f", "g", 4.0)]
    assert bad == [(inputs, 2, "expected two tab-separated sentences"), (inputs, 3, "sentence in column 2 is empty"),
                   (gold, 4, "gold score 'nan' is not finite"), (inputs, 6, "not valid UTF-8 (byte 0 of the line)")]
    with pytest.raises(STSDataError, match=r"STS\.input\.x\.txt:2: expected two tab-separated sentences"):
        list(semeval_pairs(inputs, gold))
