"""Shared benchmark plumbing.

- `record(group, label, **extra)` after a pytest-benchmark run stores its median time under a
  group and a label; the terminal summary prints each group's times side by side.
- `goal(name, measured, target, ...)` states a measured ratio (or fraction) against its goal; the
  summary prints one table of every goal, met or not met.
- `measure(group, label, value, unit)` stores a figure that is not a time (bytes, counts); the
  summary prints them in their units.

Times, goals and figures are written to `bench-ratios.json` in the working directory (or $FLOWCORE_BENCH_JSON).
"""
import json
import os
from collections import defaultdict

import pytest

MEDIANS: dict[str, dict[str, float]] = defaultdict(dict)
EXTRA: dict[str, dict[str, float]] = defaultdict(dict)
GOALS: dict[str, dict] = {}
MEASURES: dict[str, dict[str, dict]] = defaultdict(dict)


@pytest.fixture
def record(request):
    """`record(group, label)` after a benchmark run stores its median time for the summary;
    `record(group, label, median=seconds)` stores a time measured by hand."""
    def _record(group: str, label: str, median: float | None = None, **extra) -> float:
        benchmark = request.getfixturevalue("benchmark") if median is None else None
        if median is None:
            median = benchmark.stats.stats.median
        MEDIANS[group][label] = median
        EXTRA[group].update(extra)
        if benchmark is not None:
            benchmark.extra_info.update(extra)
        return median
    return _record


@pytest.fixture
def measure():
    """`measure(group, label, value, unit)`: a figure in its own unit for the summary."""
    def _measure(group: str, label: str, value: float, unit: str) -> None:
        MEASURES[group][label] = {"value": float(value), "unit": unit}
    return _measure


@pytest.fixture
def goal():
    """`goal(name, measured, target, at_most=False, how="")`: `measured` against `target` (met
    when measured >= target, or <= target with `at_most`); `how` says what was divided by what."""
    def _goal(name: str, measured: float, target: float, at_most: bool = False, how: str = "") -> bool:
        met = measured <= target if at_most else measured >= target
        GOALS[name] = {"measured": float(measured), "target": float(target),
                       "goal": f"{'<=' if at_most else '>='} {target:g}", "met": bool(met), "how": how,
                       "load_avg_1min": round(os.getloadavg()[0], 2)}
        return met
    return _goal


def pytest_terminal_summary(terminalreporter):
    if not MEDIANS and not GOALS and not MEASURES:
        return
    summary = {}
    if MEDIANS:
        terminalreporter.section("flowcore benchmark times (medians; ratio = other / first label)")
    for group, medians in MEDIANS.items():
        first_label, first = next(iter(medians.items()))
        line = [f"{group}: {first_label} {first * 1e3:.2f} ms"]
        for label, median in list(medians.items())[1:]:
            line.append(f"{label} {median * 1e3:.2f} ms ({median / first:.2f}x of {first_label})")
        for key, value in EXTRA[group].items():
            line.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
        terminalreporter.write_line("; ".join(line))
        summary[group] = {"median_s": medians, **EXTRA[group]}
    if MEASURES:
        terminalreporter.section("flowcore measurements")
        for group, figures in MEASURES.items():
            terminalreporter.write_line(f"{group}: " + "; ".join(
                f"{label} {row['value']:.4g} {row['unit']}" for label, row in figures.items()))
        summary["measures"] = MEASURES
    if GOALS:
        terminalreporter.section("flowcore goals")
        width = max(len(name) for name in GOALS)
        terminalreporter.write_line(f"{'goal':<{width}}  {'measured':>9}  {'target':>9}  result   load")
        for name, row in GOALS.items():
            terminalreporter.write_line(f"{name:<{width}}  {row['measured']:>9.3g}  {row['goal']:>9}  "
                                        f"{'met    ' if row['met'] else 'NOT MET'}  {row['load_avg_1min']:.1f}"
                                        + (f"   ({row['how']})" if row["how"] else ""))
        summary["goals"] = GOALS
    path = os.environ.get("FLOWCORE_BENCH_JSON", "bench-ratios.json")
    with open(path, "w") as stream:
        json.dump(summary, stream, indent=2)
