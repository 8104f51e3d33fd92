"""The host side of a Triton launch: eager calls skip the custom-op layers, traced or intercepted
calls go through the registered op, and launches are guarded onto the tensor's own GPU."""
import types
from unittest import mock

import pytest
import torch
from torch._library.custom_ops import CustomOpDef
from torch.utils._python_dispatch import TorchDispatchMode

import flowcore.kernels.triton._utils as kernel_utils
from flowcore.kernels import Plan, couple_ref


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_eager_calls_launch_directly_and_traced_calls_use_the_registered_op():
    x2, h = torch.randn(5, 6), torch.randn(5, 12)
    expected, triton = couple_ref(x2, h), Plan("triton")
    with mock.patch.object(CustomOpDef, "__call__", side_effect=AssertionError("op layer")):
        z2, logdet = triton.couple(x2, h)  # plain eager: never enters the custom-op layers
        torch.testing.assert_close(z2, expected[0])
        torch.testing.assert_close(logdet, expected[1])
        with _Passthrough(), pytest.raises(AssertionError, match="op layer"):
            triton.couple(x2, h)  # a dispatch mode must see the op


def test_launches_are_guarded_onto_the_tensors_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    on_second_gpu = types.SimpleNamespace(device=torch.device("cuda", 1))
    guard = kernel_utils.device_guard(on_second_gpu)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    for tensor in (types.SimpleNamespace(device=torch.device("cuda", 0)), torch.zeros(1)):
        assert not isinstance(kernel_utils.device_guard(tensor), torch.cuda.device)
