"""The private helpers every package shares: durable writes, the line reader, thread pinning."""
import hashlib
import os
import stat

import pytest
import torch

from flowcore._fs import atomic_write, atomic_write_json, file_sha256, remove_temporaries
from flowcore._lines import iter_lines, read_lines
from flowcore.runtime import available_cpus, check_threads, pinned_threads, side_by_side


def test_atomic_write_replaces_whole_files_with_normal_permissions(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    atomic_write(target, lambda stream: stream.write(b"new content"))
    assert target.read_bytes() == b"new content"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["out.bin"]


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def broken(stream):
        stream.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_temporaries_left_by_a_killed_write_are_removed(tmp_path):
    target = tmp_path / "out[1].json"
    for stale in (".out[1].json.abc123.tmp", ".out[1].json.x.tmp"):
        (tmp_path / stale).write_bytes(b"half")
    (tmp_path / ".other.json.abc.tmp").write_bytes(b"not ours")
    remove_temporaries(target)
    assert sorted(os.listdir(tmp_path)) == [".other.json.abc.tmp"]


def test_atomic_json_and_sha256(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"b": 1}, sort_keys=True)
    assert (tmp_path / "a.json").read_text() == '{"b": 1}'
    assert file_sha256(tmp_path / "a.json") == hashlib.sha256(b'{"b": 1}').hexdigest()


def test_line_reader_policy(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\n" + "second\u2028half\n".encode() + b"caf\xe9\n\nlast\r")
    lines = list(iter_lines(path))
    assert [line.text for line in lines] == ["first", "second\u2028half", None, "", "last"]
    assert [line.number for line in lines] == [1, 2, 3, 4, 5]
    assert lines[2].bad_byte == 3
    assert lines[-1].end == path.stat().st_size
    resumed = list(iter_lines(path, offset=lines[1].end, line=2))
    assert resumed == lines[2:]
    with pytest.raises(ValueError, match=r"lines.txt:3: not valid UTF-8 \(byte 3 of the line\)"):
        read_lines(path)
    with pytest.raises(KeyError, match="missing file"):
        read_lines(tmp_path / "nope.txt", error=KeyError)


def test_pinned_threads_restore_and_none_leaves_torch_alone():
    before = torch.get_num_threads()
    with pinned_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with pinned_threads(None):
        assert torch.get_num_threads() == before
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)
    assert check_threads(None) is None and check_threads(3) == 3
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            check_threads(bad)


@pytest.mark.parametrize("workers", [1, 3])
def test_side_by_side_runs_every_item_and_raises_the_first_failure(workers):
    import threading
    import time
    done, threads = [], set()

    def run(item):
        threads.add(threading.get_ident())
        time.sleep(0.002)
        done.append(item)

    side_by_side(workers, run, range(12))
    assert sorted(done) == list(range(12))
    assert (threads == {threading.get_ident()}) == (workers == 1), "one worker runs in this thread"
    if workers == 1:
        assert done == list(range(12)), "one worker runs the items in order"

    started = []

    def failing(item):
        started.append(item)
        if item in (2, 5):
            time.sleep(0.01 * (5 - item))  # item 5 fails first in time, item 2 first in order
            raise ValueError(f"item {item}")
        time.sleep(0.01)

    with pytest.raises(ValueError, match="item 2"):
        side_by_side(workers, failing, range(200))
    assert len(started) < 200, "the items not started yet are dropped"



def test_progress_bars_show_on_a_terminal_unless_told(monkeypatch):
    import sys

    from flowcore._progress import progress_wanted

    for terminal in (True, False):
        monkeypatch.setattr(sys.stderr, "isatty", lambda terminal=terminal: terminal)
        assert progress_wanted(None) is terminal
        assert progress_wanted(True) is True and progress_wanted(False) is False
