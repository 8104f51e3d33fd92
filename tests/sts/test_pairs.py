"""Your own labelled pairs: every format with named and positional columns, SentEval files and
folders, and bad lines failing with file:line or skipped and counted."""
import json
import logging

import numpy as np
import pytest

from flowcore.sts.data import STSDataError
from flowcore.sts.pairs import PAIRS_SPLIT, PairColumns, load_pairs, load_pairs_files, pairs_name

PAIRS = [("A man plays a guitar.", "A person plays music.", 4.2),
         ("A cat sleeps.", "The stock market fell.", 0.0),
         ('He said "hi", then left.', "He greeted and went.", 3.5)]


def _check(pairs, name, skipped=0):
    assert pairs.dataset == name and pairs.split == PAIRS_SPLIT and pairs.skipped_lines == skipped
    assert pairs.sentences1 == [p[0] for p in PAIRS] and pairs.sentences2 == [p[1] for p in PAIRS]
    np.testing.assert_array_equal(pairs.scores, [p[2] for p in PAIRS])
    assert pairs.subsets == [name] * 3 and len(pairs) == 3


def _tsv(rows):
    return "".join("\t".join(map(str, row)) + "\n" for row in rows)


@pytest.mark.parametrize("header", [("sentence1", "sentence2", "score"), ("s1", "s2", "label"),
                                    ("Sentence_A", "Sentence_B", "relatedness_score")])
def test_tsv_with_a_recognised_header(tmp_path, header):
    path = tmp_path / "mine.tsv"
    path.write_text(_tsv([header] + PAIRS), encoding="utf-8")
    _check(load_pairs(path), "mine")


def test_tsv_headerless_positions_and_named_columns(tmp_path):
    path = tmp_path / "plain.tsv"
    path.write_text(_tsv(PAIRS) + "\n", encoding="utf-8")  # a trailing blank line is ignored
    _check(load_pairs(path), "plain")
    _check(load_pairs(path, "0,1,2"), "plain")
    shuffled = tmp_path / "shuffled.tsv"
    shuffled.write_text(_tsv([("id", "score", "b", "a")] + [(i, s, b, a) for i, (a, b, s) in enumerate(PAIRS)]))
    _check(load_pairs(shuffled, "a,b,score"), "shuffled")
    headerless = tmp_path / "headerless.tsv"
    headerless.write_text(_tsv([(i, s, b, a) for i, (a, b, s) in enumerate(PAIRS)]))
    _check(load_pairs(headerless, PairColumns(3, 2, 1)), "headerless")


def test_csv_quoted_fields_named_and_positional(tmp_path):
    rows = [("sentence1", "sentence2", "score")] + PAIRS
    path = tmp_path / "quoted.csv"
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(rows)
    _check(load_pairs(path), "quoted")
    _check(load_pairs(path, "sentence1,sentence2,score"), "quoted")
    headerless = tmp_path / "headerless.csv"
    with open(headerless, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([(s, a, b) for a, b, s in PAIRS])
    _check(load_pairs(headerless, "1,2,0"), "headerless")


SPANNING = [  # one pair per line: a record over several lines is bad, all its lines are skipped
    ("multi.csv", 's1,s2,score\na,b,1\n"two\nlines",b,1\nc,d,2\n', 3, 4, 2),
    ("closed_later.csv", 's1,s2,score\na,b,1\n"He said hi,b,1\nc,d,2\ne",f,3\ng,h,4\n', 3, 5, 3),
    ("never_closed.csv", 's1,s2,score\na,b,1\nx,y,2\n"He said hi,b,1\nc,d,2\ne,f,3\n', 4, 6, 3),
]


@pytest.mark.parametrize("name, content, first, last, skipped", SPANNING, ids=[s[0] for s in SPANNING])
def test_csv_record_spanning_lines_is_bad_and_all_its_lines_are_skipped(tmp_path, caplog, name, content, first,
                                                                        last, skipped):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    spans = f"{path}:{first}: quoted field spans lines {first}-{last}"
    with pytest.raises(STSDataError) as error:
        load_pairs(path)
    assert str(error.value).startswith(spans) and "unbalanced quote?" in str(error.value)
    with caplog.at_level(logging.WARNING, logger="flowcore.sts"):
        pairs = load_pairs(path, skip_bad=True)
    assert pairs.skipped_lines == skipped and len(pairs) == 2
    assert "He said" not in " ".join(pairs.sentences1) and "\n" not in " ".join(pairs.sentences1)
    assert caplog.messages == [f"{path}: skipped {skipped} bad line(s); the first: {error.value}"]


def test_jsonl_objects_and_arrays(tmp_path):
    path = tmp_path / "objects.jsonl"
    path.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in PAIRS))
    _check(load_pairs(path), "objects")
    keyed = tmp_path / "keyed.jsonl"
    keyed.write_text("".join(json.dumps({"q": a, "d": b, "rel": str(s)}) + "\n" for a, b, s in PAIRS))
    _check(load_pairs(keyed, "q,d,rel"), "keyed")
    arrays = tmp_path / "arrays.jsonl"
    arrays.write_text("".join(json.dumps([s, a, b]) + "\n" for a, b, s in PAIRS))
    _check(load_pairs(arrays, "1,2,0"), "arrays")
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps([a, b, s]) + "\n" for a, b, s in PAIRS))
    _check(load_pairs(plain), "plain")


def _senteval(folder, name, pairs, golds):
    folder.mkdir(exist_ok=True)
    (folder / f"STS.input.{name}.txt").write_text(_tsv([(a, b) for a, b, _ in pairs]), encoding="utf-8")
    (folder / f"STS.gs.{name}.txt").write_text("".join(f"{g}\n" for g in golds), encoding="utf-8")
    return folder / f"STS.input.{name}.txt"


def test_senteval_file_and_folder(tmp_path):
    extra = ("An unscored pair.", "Skipped.", None)
    path = _senteval(tmp_path / "se", "news", PAIRS[:2] + [extra] + PAIRS[2:], [4.2, 0.0, "", 3.5])
    _check(load_pairs(path), "news")
    assert pairs_name(path) == "news"
    _senteval(tmp_path / "se", "forum", PAIRS[:2], [1, 2])
    folder = load_pairs(tmp_path / "se")
    assert folder.dataset == "se" and len(folder) == 5
    assert folder.subsets == ["forum", "forum", "news", "news", "news"]
    with pytest.raises(STSDataError, match="SentEval pairs have fixed columns"):
        load_pairs(path, "0,1,2")
    (tmp_path / "se" / "STS.gs.news.txt").unlink()
    with pytest.raises(STSDataError, match=r"missing file: .*STS\.gs\.news\.txt"):
        load_pairs(path)


BAD = [  # (file name, content, the bad line, message)
    ("cols.tsv", "s1\ts2\tscore\na\tb\t1\nonly one\n c\td\t2\ne\tf\t3\n", 3, "expected at least 3 columns, found 1"),
    ("nan.tsv", "a\tb\t1\nc\td\tnan\ne\tf\t2\ng\th\t3\n", 2, "score 'nan' in column 2 (0-based) is not finite"),
    ("text.tsv", "a\tb\t1\nc\td\thigh\ne\tf\t2\ng\th\t3\n", 2, "score 'high' in column 2 (0-based) is not a number"),
    ("empty.csv", "s1,s2,score\na,b,1\n , d,2\ne,f,3\ng,h,4\n", 3, "sentence in column 's1' is empty"),
    ("broken.csv", 's1,s2,score\na,b,1\n"c"x,d,2\ne,f,3\ng,h,4\n', 3, "broken CSV"),
    ("broken.jsonl", '["a","b",1]\n["c","d",\n["e","f",2]\n["g","h",3]\n', 2, "broken JSON"),
    ("key.jsonl", '{"s1":"a","s2":"b","score":1}\n{"s1":"c","score":2}\n{"s1":"e","s2":"f","score":2}\n'
     '{"s1":"g","s2":"h","score":3}\n', 2, "no recognised keys"),
    ("inf.jsonl", '["a","b",1]\n["c","d","inf"]\n["e","f",2]\n["g","h",3]\n', 2, "is not finite"),
    ("bool.jsonl", '["a","b",1]\n["c","d",true]\n["e","f",2]\n["g","h",3]\n', 2, "not a number"),
]


@pytest.mark.parametrize("name, content, line, message", BAD, ids=[b[0] for b in BAD])
def test_bad_lines_name_file_and_line_or_are_skipped(tmp_path, caplog, name, content, line, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(STSDataError) as error:
        load_pairs(path)
    assert str(error.value).startswith(f"{path}:{line}: ") and message in str(error.value)
    with caplog.at_level(logging.WARNING, logger="flowcore.sts"):
        pairs = load_pairs(path, skip_bad=True)
    assert pairs.skipped_lines == 1 and len(pairs) == 3
    assert caplog.messages == [f"{path}: skipped 1 bad line(s); the first: {error.value}"]


def test_invalid_utf8_names_the_line_in_every_format(tmp_path):
    for name, good in (("u.tsv", b"a\tb\t1\n"), ("u.csv", b"a,b,1\n"), ("u.jsonl", b'["a","b",1]\n')):
        path = tmp_path / name
        path.write_bytes(good + good.replace(b"a", b"\xff") + good + good)
        with pytest.raises(STSDataError, match=rf"{name}:2: not valid UTF-8 \(byte \d of the line\)"):
            load_pairs(path)
        assert load_pairs(path, skip_bad=True).skipped_lines == 1
    path = _senteval(tmp_path / "se", "x", PAIRS, [1, 2, 3])
    (tmp_path / "se" / "STS.gs.x.txt").write_bytes(b"1\n\xff\n3\n")
    with pytest.raises(STSDataError, match=r"STS\.gs\.x\.txt:2: not valid UTF-8"):
        load_pairs(path)
    assert len(load_pairs(path, skip_bad=True)) == 2


def test_file_level_errors(tmp_path):
    with pytest.raises(STSDataError, match="missing file"):
        load_pairs(tmp_path / "none.tsv")
    (tmp_path / "x.txt").write_text("a\tb\t1\n")
    with pytest.raises(STSDataError, match="unknown pairs format"):
        load_pairs(tmp_path / "x.txt")
    (tmp_path / "h.tsv").write_text("first\tsecond\tgrade\na\tb\t1\n")
    with pytest.raises(STSDataError, match=r"h\.tsv:1: neither a header"):
        load_pairs(tmp_path / "h.tsv")
    with pytest.raises(STSDataError, match=r"h\.tsv:1: the header has no column 'third'"):
        load_pairs(tmp_path / "h.tsv", "first,second,third")
    (tmp_path / "one.tsv").write_text("a\tb\t1\n")
    with pytest.raises(STSDataError, match="1 scored pair"):
        load_pairs(tmp_path / "one.tsv")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "same.tsv").write_text(_tsv(PAIRS))
    with pytest.raises(STSDataError, match="both named 'same'"):
        load_pairs_files([tmp_path / "a" / "same.tsv", tmp_path / "b" / "same.tsv"])
    (tmp_path / "se").mkdir()
    (tmp_path / "se" / "STS.input.x.txt").write_text("a\tb\nc\td\n")
    (tmp_path / "se" / "STS.gs.x.txt").write_text("1\n")
    with pytest.raises(STSDataError, match="they must align"):
        load_pairs(tmp_path / "se")


@pytest.mark.parametrize("text, message", [("a,b", "three comma-separated"), ("0,b,2", "not a mix"),
                                           ("1,1,2", "must differ"), ("a,a,b", "must differ")])
def test_column_specs_are_checked(text, message):
    with pytest.raises(ValueError, match=message):
        PairColumns.parse(text)
