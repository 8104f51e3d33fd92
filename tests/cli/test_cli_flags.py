"""The command line's flags, snapshotted and held to one language.

- Every subcommand's flags (spellings, defaults, choices, hidden aliases) equal the snapshot in
  tests/cli/flags.json, so a flag cannot appear, vanish or change by accident. After a deliberate
  change: `FLOWCORE_UPDATE_FLAGS=1 pytest tests/cli/test_cli_flags.py`, and review the diff.
- One concept, one flag: the same spelling in every subcommand that has the concept.
- Each hidden alias says, in one line on stderr, which flag replaces it, and does its job.
"""
import argparse
import json
import os
from pathlib import Path

import pytest

from flowcore.cli import SUBCOMMANDS, build_parser

SNAPSHOT = Path(__file__).with_name("flags.json")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _describe(action: argparse.Action) -> dict:
    default = action.default if action.default is not argparse.SUPPRESS else "(suppressed)"
    if isinstance(default, Path):
        default = str(default)
    if not isinstance(default, (str, int, float, bool, type(None), list)):
        default = repr(default)
    return {"flags": action.option_strings, "dest": action.dest, "default": default,
            "choices": list(action.choices) if action.choices is not None else None,
            "required": action.required, "hidden": action.help == argparse.SUPPRESS}


def _flags() -> dict:
    return {name: [_describe(action) for action in parser._actions if not isinstance(action, argparse._HelpAction)]
            for name, parser in _subparsers().items()}


def test_every_flag_matches_the_snapshot(monkeypatch):
    monkeypatch.delenv("FLOWCORE_DATA", raising=False)  # sts --data-dir's default comes from it
    flags = _flags()
    if os.environ.get("FLOWCORE_UPDATE_FLAGS"):
        SNAPSHOT.write_text(json.dumps(flags, indent=1, sort_keys=True) + "\n")
    assert flags == json.loads(SNAPSHOT.read_text()), "flags changed: see the module docstring to update the snapshot"


CONCEPTS = {  # the one flag of a concept, and the subcommands that have the concept
    "--input": ("fit", "encode", "calibrate", "analyze"),
    "--embeddings": ("fit", "calibrate", "analyze"),
    "--out": ("fit", "encode", "calibrate", "export", "analyze"),
    "--calibrator": ("calibrate", "sts", "export"),
    "--model": ("fit", "encode", "calibrate", "sts", "export", "analyze"),
    "--pooling": ("fit", "encode", "calibrate", "sts", "export", "analyze"),
    "--batch-size": ("fit", "encode", "calibrate", "sts", "analyze"),
    "--max-length": ("fit", "encode", "sts", "export", "analyze"),
    "--device": SUBCOMMANDS,
    "--quantize": ("fit", "encode", "calibrate", "sts", "analyze"),
    "--quiet": SUBCOMMANDS,
    "--progress": SUBCOMMANDS,
    "--config": ("fit", "sts"),
    "--recipe": ("fit", "sts"),
    "--epochs": ("fit", "sts"),
    "--lr": ("fit", "sts"),
    "--train-batch-size": ("fit", "sts"),
    "--whitening-power": ("fit", "sts", "export", "analyze"),
    "--whitening-dim": ("fit", "sts", "export", "analyze"),
    "--abtt-k": ("fit", "sts", "analyze"),
    "--calibration": ("fit", "sts", "analyze"),
    "--seed": ("fit", "sts", "export", "analyze"),
}


@pytest.mark.parametrize("flag", sorted(CONCEPTS))
def test_one_concept_has_one_flag_in_every_subcommand(flag):
    parsers = _subparsers()
    for name in CONCEPTS[flag]:
        visible = {option for action in parsers[name]._actions if action.help != argparse.SUPPRESS
                   for option in action.option_strings}
        assert flag in visible, f"flowcore {name} lacks {flag}"


ALIASES = [  # (subcommand and arguments with the old spelling, the old flag, its replacement, what it must set)
    (["sts", "--flow", "m.flow"], "--flow", "--calibrator", ("calibrator", "m.flow")),
    (["sts", "--flow-config", "l2_d2_w32"], "--flow-config", "--config", ("config", "l2_d2_w32")),
    (["sts", "--flow-recipe", "paper"], "--flow-recipe", "--recipe", ("recipe", "paper")),
    (["sts", "--flow-epochs", "2"], "--flow-epochs", "--epochs", ("epochs", 2)),
    (["sts", "--flow-lr", "0.01"], "--flow-lr", "--lr", ("lr", 0.01)),
    (["sts", "--flow-batch-size", "16"], "--flow-batch-size", "--train-batch-size", ("train_batch_size", 16)),
    (["calibrate", "--flow", "m.flow", "--embeddings", "e.npy", "--out", "o.npy"], "--flow", "--calibrator",
     ("calibrator", "m.flow")),
    (["calibrate", "--calibrator", "m.flow", "--embeddings", "e.npy", "--out", "o.npy", "--no-progress"],
     "--no-progress", "--quiet", ("quiet", True)),
    (["export", "--flow", "m.flow", "--out", "st"], "--flow", "--calibrator", ("calibrator", "m.flow")),
    (["analyze", "--corpus", "c.txt", "--out", "r"], "--corpus", "--input", ("input", "c.txt")),
]


@pytest.mark.parametrize("argv, old, new, expected", ALIASES, ids=[f"{a[0][0]} {a[1]}" for a in ALIASES])
def test_an_old_spelling_works_and_says_what_replaces_it(argv, old, new, expected, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, expected[0]) == expected[1]
    assert capsys.readouterr().err == f"flowcore {argv[0]}: {old} is now {new}; the old spelling goes at 1.0\n"


def test_help_states_each_default_once():
    for name, parser in _subparsers().items():
        text = parser.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, name
        for line in text.split("  --")[1:]:
            assert line.count("default:") <= 1, f"{name}: --{line[:80]}"


@pytest.mark.parametrize("flag", sorted(set(CONCEPTS) | {"--whitening-dim", "--calibration"}))
def test_a_flag_shows_the_same_value_name_in_every_subcommand(flag):
    shown = {}
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if flag in action.option_strings and action.help != argparse.SUPPRESS and action.nargs != 0:
                shown[name] = action.metavar or action.dest.upper()
    assert len(set(shown.values())) <= 1, shown


@pytest.mark.parametrize("flag", ["--max-rows", "--epochs", "--lr", "--train-batch-size"])
def test_every_default_is_stated_as_a_value(flag):
    """A default that depends on something else (the recipe) still says what it is."""
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if flag in action.option_strings and action.help != argparse.SUPPRESS:
                assert "default:" in action.help and not action.help.rstrip(")").endswith("the recipe's"), name
