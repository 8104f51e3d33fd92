"""FlowCalibrator on a CUDA device: transform / inverse_transform stream host arrays through the
GPU with overlapped transfers and equal the CPU results (float32 tolerance) on every chunk
layout, input kind and dtype; bad rows are named (marked `gpu`, skipped without CUDA). The
streaming pipeline itself also runs on the CPU with the CUDA calls stood in for."""
import numpy as np
import pytest
import torch

import flowcore

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(3000, 24)) @ rng.normal(size=(24, 24)) + 1).astype(np.float32)
    data[:, 5] = 2.0  # a constant coordinate: the standardizer's gather/scatter path
    path = tmp_path_factory.mktemp("flow") / "model.flow"
    flowcore.FlowCalibrator(config="l2_d2_w32", epochs=1, batch_size=64, seed=1).fit(data,
                                                                                     show_progress_bar=False).save(path)
    return path, data


@pytest.mark.gpu
@needs_cuda
def test_gpu_transform_equals_cpu_on_every_chunk_layout(fitted, tmp_path):
    path, data = fitted
    cpu, gpu = flowcore.FlowCalibrator.load(path), flowcore.FlowCalibrator.load(path, device="cuda")
    expected = cpu.transform(data)
    memmap = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=data.shape)
    memmap[:] = data
    for X, chunk_rows in ((data, 1000), (data, 64), (data, 10**6), (memmap, 777), (data.astype(np.float64), 500),
                          (torch.from_numpy(data), 1000)):
        Z = gpu.transform(X, chunk_rows=chunk_rows)
        assert Z.dtype == np.float32 and Z.shape == data.shape
        np.testing.assert_allclose(Z, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gpu.inverse_transform(expected, chunk_rows=999), cpu.inverse_transform(expected),
                               rtol=1e-4, atol=1e-4)
    assert gpu.transform(data[:0]).shape == (0, data.shape[1])


@pytest.mark.gpu
@needs_cuda
def test_gpu_transform_names_bad_rows(fitted):
    path, data = fitted
    gpu = flowcore.FlowCalibrator.load(path, device="cuda")
    bad = data.copy()
    bad[[7, 2500]] = np.nan
    with pytest.raises(ValueError, match=r"X has NaN or Inf values in row\(s\) 7\b"):
        gpu.transform(bad, chunk_rows=1000)
    with pytest.raises(ValueError, match=r"row\(s\) 2500"):
        gpu.transform(np.concatenate([data[:2500], bad[2500:]]), chunk_rows=1000)  # in the third chunk
    with pytest.raises(ValueError, match=r"shape \(rows, 24\)"):
        gpu.transform(data[:, :5])


class _FakeEvent:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _FakeStream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def cuda_stand_ins(monkeypatch):
    """The CUDA calls of `map_on_cuda` as no-ops, pinned memory as plain memory: its chunking,
    buffer rotation, row numbering and copies run (on the CPU) without a GPU."""
    import contextlib

    from flowcore.calibration import cuda_streaming

    real_empty = torch.empty
    monkeypatch.setattr(cuda_streaming.torch, "empty",
                        lambda *args, pin_memory=False, **kwargs: real_empty(*args, **kwargs))
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    return cuda_streaming.map_on_cuda


@pytest.mark.parametrize("rows,chunk_rows", [(10, 3), (9, 3), (1, 5), (0, 4), (1000, 64)])
def test_the_streaming_pipeline_maps_every_row_once_in_order(cuda_stand_ins, rows, chunk_rows):
    X = np.arange(rows * 4, dtype=np.float64).reshape(rows, 4)
    Z = cuda_stand_ins(X, lambda x: 2 * x + 1, dim=4, device=torch.device("cpu"), dtype=torch.float32,
                       chunk_rows=chunk_rows)
    np.testing.assert_array_equal(Z, (2 * X + 1).astype(np.float32))


def test_the_streaming_pipeline_names_the_first_bad_rows(cuda_stand_ins):
    X = np.zeros((20, 3), dtype=np.float32)
    X[[13, 17], 1] = np.inf
    with pytest.raises(ValueError, match=r"Z has NaN or Inf values in row\(s\) 13, 17 \(0-based\)"):
        cuda_stand_ins(X, lambda x: x, dim=3, device=torch.device("cpu"), dtype=torch.float32, chunk_rows=6,
                       name="Z")
