"""A pytest plugin (`-p jsonl_results`, with bench/ on the path) that appends one JSON line per
test result to $FLOWCORE_TEST_JSONL as soon as it is known, so a run stopped at its time limit
still reports every test that finished (junit XML is written only at the end). Under
pytest-xdist only the controller writes (workers' reports reach it)."""
import json
import os

_WRITER = {"on": True}


def pytest_configure(config):
    _WRITER["on"] = not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    path = os.environ.get("FLOWCORE_TEST_JSONL")
    if not path or not _WRITER["on"] or (report.when != "call" and report.outcome == "passed"):
        return
    message = "" if report.outcome == "passed" else str(report.longrepr)[-1500:]
    with open(path, "a") as stream:
        stream.write(json.dumps({"test": report.nodeid, "when": report.when, "outcome": report.outcome,
                                 "seconds": round(report.duration, 2), "message": message}) + "\n")
