"""Shared benchmark plumbing: suites record medians under a group name and a label, and the
terminal summary prints each group's speed ratios side by side (also written to
`bench-ratios.json` in the working directory, or $FLOWCORE_BENCH_JSON)."""
import json
import os
from collections import defaultdict

import pytest

MEDIANS: dict[str, dict[str, float]] = defaultdict(dict)
EXTRA: dict[str, dict[str, float]] = defaultdict(dict)


@pytest.fixture
def record(benchmark):
    """`record(group, label)` after a benchmark run stores its median time for the summary."""
    def _record(group: str, label: str, **extra) -> float:
        median = benchmark.stats.stats.median
        MEDIANS[group][label] = median
        EXTRA[group].update(extra)
        benchmark.extra_info.update(extra)
        return median
    return _record


def pytest_terminal_summary(terminalreporter):
    if not MEDIANS:
        return
    terminalreporter.section("flowcore benchmark ratios (median times; ratio = other / fastest-first label)")
    summary = {}
    for group, medians in MEDIANS.items():
        first_label, first = next(iter(medians.items()))
        line = [f"{group}: {first_label} {first * 1e3:.2f} ms"]
        for label, median in list(medians.items())[1:]:
            line.append(f"{label} {median * 1e3:.2f} ms ({median / first:.2f}x of {first_label})")
        for key, value in EXTRA[group].items():
            line.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
        terminalreporter.write_line("; ".join(line))
        summary[group] = {"median_s": medians, **EXTRA[group]}
    path = os.environ.get("FLOWCORE_BENCH_JSON", "bench-ratios.json")
    with open(path, "w") as stream:
        json.dump(summary, stream, indent=2)
