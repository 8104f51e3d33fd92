"""The PyTorch backend's folded affine step (`flowcore.kernels.torch_step`): the hand-written
`_TorchAffineStep` backward and the no-autograd path, against `folded_affine_step_ref` and a
float64 reference."""
import pytest
import torch

from flowcore.backend import use_backend
from flowcore.kernels import SCALE_OFFSET, folded_affine_step, folded_affine_step_ref
from flowcore.kernels.torch_step import _TorchAffineStep

from helpers.kernel_checks import assert_as_accurate_as_ref, assert_close_scaled, coupling_mlp


def _inputs(rows, d, dtype):
    x = (torch.randn(rows, d) + 0.3).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d))[0] * 1.2).to(dtype)
    return x, weight, (0.2 * torch.randn(d)).to(dtype)


def _mlp(split, out, dtype, depth=3, width=16, seed=0):
    torch.manual_seed(seed)
    return coupling_mlp(split, out, dtype, depth, width)


def _step_and_grads(step, x, weight, bias, split, net, cotangents, wrt):
    z, logdet = step(x, weight, bias, split, net)
    leaves = [t for t in (x, weight, bias, *net.parameters()) if t.requires_grad]
    grads = torch.autograd.grad((z, logdet), leaves, [c.to(z.dtype) for c in cotangents])
    return z, logdet, dict(zip([name for name, t in wrt if t.requires_grad], grads)), z.grad_fn


def _named(x, weight, bias, net):
    return [("x", x), ("weight", weight), ("bias", bias), *net.named_parameters()]


def _check_torch_training_step(rows, d, depth, dtype, trainable=("x", "weight", "bias", "net")):
    split = d // 2
    generator = torch.Generator().manual_seed(3)
    cotangents = [torch.randn(rows, d, generator=generator, dtype=torch.float64),
                  torch.randn(rows, generator=generator, dtype=torch.float64)]
    results = {}
    for label, run_dtype, op in (("fused", dtype, folded_affine_step), ("ref", dtype, folded_affine_step_ref),
                                 ("float64", torch.float64, folded_affine_step_ref)):
        torch.manual_seed(1)
        x, weight, bias = (t.to(run_dtype) for t in _inputs(rows, d, torch.float64))
        net = _mlp(split, 2 * (d - split), run_dtype, depth)
        for name, tensor in (("x", x), ("weight", weight), ("bias", bias)):
            tensor.requires_grad_(name in trainable)
        net.requires_grad_("net" in trainable)
        with use_backend("torch"):
            results[label] = _step_and_grads(op, x, weight, bias, split, net, cotangents, _named(x, weight, bias, net))
    z, logdet, grads, grad_fn = results["fused"]
    assert type(grad_fn).__name__ == "_TorchAffineStepBackward", "the hand-written step did not run"
    what = f"torch step {rows}x{d} depth {depth}"
    close = assert_as_accurate_as_ref if dtype in (torch.float16, torch.bfloat16) else assert_close_scaled
    close(z, results["ref"][0], results["float64"][0], f"{what} z")
    close(logdet, results["ref"][1], results["float64"][1], f"{what} logdet")
    assert grads.keys() == results["ref"][2].keys() and grads, f"{what}: gradients for {sorted(grads)}"
    for name, grad in grads.items():
        close(grad, results["ref"][2][name], results["float64"][2][name], f"{what} d{name}")
    return grads


@pytest.mark.parametrize("rows,d", [(1, 96), (7, 95), (300, 383), (767, 64), (1023, 33)])
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_torch_training_step_matches_reference(rows, d, depth, dtype):
    grads = _check_torch_training_step(rows, d, depth, dtype)
    assert {"x", "weight", "bias", "0.weight", "0.bias"} <= grads.keys()


@pytest.mark.parametrize("trainable,expected", [
    (("weight", "bias"), {"weight", "bias"}),
    (("net",), {f"{i}.{kind}" for i in (0, 2, 4) for kind in ("weight", "bias")}),
    (("x",), {"x"}),
], ids=["frozen-conditioner", "conditioner-only", "input-only"])
def test_torch_training_step_with_some_inputs_frozen(trainable, expected):
    assert set(_check_torch_training_step(45, 30, 3, torch.float64, trainable)) == expected


def test_torch_training_step_passes_gradcheck():
    torch.manual_seed(0)
    x, weight, bias = (t.requires_grad_() for t in _inputs(5, 7, torch.float64))
    layers = tuple(p.detach().requires_grad_() for p in _mlp(3, 8, torch.float64, depth=2, width=4).parameters())
    def step(*inputs):
        return _TorchAffineStep.apply(*inputs[:3], 3, folded_affine_step_ref, *inputs[3:])

    assert torch.autograd.gradcheck(step, (x, weight, bias, *layers))


def test_torch_step_other_conditioners_run_the_composed_reference():
    x, weight, bias = _inputs(20, 16, torch.float64)
    weight.requires_grad_()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()).double()  # not Linear/ReLU
    with use_backend("torch"):
        z, logdet = folded_affine_step(x, weight, bias, 8, net)
        assert type(z.grad_fn).__name__ != "_TorchAffineStepBackward"
        with torch.no_grad():
            z_nograd, logdet_nograd = folded_affine_step(x, weight, bias, 8, net)
    z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, 8, net)
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(z_nograd, z_ref.detach())
    torch.testing.assert_close(logdet_nograd, logdet_ref.detach())


def test_torch_step_without_gradients_matches_reference():
    x, weight, bias = _inputs(300, 95, torch.float64)
    net = _mlp(47, 96, torch.float64)
    with use_backend("torch"), torch.no_grad():
        z, logdet = folded_affine_step(x, weight, bias, 47, net)
        z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, 47, net)
    torch.testing.assert_close(z, z_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logdet, logdet_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_torch_step_log_det_of_a_vanishing_scale_stays_exact(dtype):
    """The log-det is the log of sigmoid's output; where that underflows to 0 (a logit of -200) it
    falls back to log sigmoid, so the log-det stays finite and equal to the reference's."""
    x, weight, bias = (t.to(dtype) for t in _inputs(5, 8, torch.float64))
    net = _mlp(4, 8, dtype, depth=1)
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.fill_(-200.0)
    with use_backend("torch"), torch.no_grad():
        z, logdet = folded_affine_step(x, weight, bias, 4, net)
        z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, 4, net)
    assert torch.isfinite(logdet).all()
    torch.testing.assert_close(logdet, logdet_ref)
    torch.testing.assert_close(z, z_ref)


def test_torch_training_step_gives_exact_second_order_gradients():
    """With create_graph the backward runs autograd of the composed twin, so double backward
    (gradient penalties, Hessian-vector products) matches the reference."""
    results = []
    for op in (folded_affine_step, folded_affine_step_ref):
        torch.manual_seed(0)
        x, weight, bias = _inputs(6, 10, torch.float64)
        x.requires_grad_()
        weight.requires_grad_()
        net = _mlp(5, 10, torch.float64)
        with use_backend("torch"):
            z, logdet = op(x, weight, bias, 5, net)
            (grad_x,) = torch.autograd.grad(z.square().sum() + logdet.sum(), x, create_graph=True)
            results.append(torch.autograd.grad(grad_x.square().sum(), [weight, *net.parameters()]))
    for fused, ref in zip(*results):
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-12)


def test_torch_step_rejects_a_conditioner_of_the_wrong_width():
    x, weight, bias = _inputs(4, 8, torch.float64)
    with use_backend("torch"), pytest.raises(ValueError, match=r"conditioner output must have 8 columns, got 6"):
        folded_affine_step(x, weight, bias, 4, _mlp(4, 6, torch.float64))


class _ShiftedSequential(torch.nn.Sequential):
    def forward(self, y1):
        return super().forward(y1) + 1.0


@pytest.mark.parametrize("kind", ["subclass", "forward-hook", "pre-hook"])
def test_torch_step_calls_conditioners_with_their_own_behaviour(kind):
    """A Sequential subclass or hooks change what the conditioner computes, so the fused path
    (which reads the Linear weights directly) must not run: the composed twin calls the module."""
    x, weight, bias = _inputs(12, 10, torch.float64)
    weight.requires_grad_()
    net = _mlp(5, 10, torch.float64)
    if kind == "subclass":
        net = _ShiftedSequential(*net)
    elif kind == "forward-hook":
        net[0].register_forward_hook(lambda module, inputs, output: output * 0.5)
    else:
        net.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 2.0,))
    with use_backend("torch"):
        z, logdet = folded_affine_step(x, weight, bias, 5, net)
        assert type(z.grad_fn).__name__ != "_TorchAffineStepBackward"
        with torch.no_grad():
            z_nograd, _ = folded_affine_step(x, weight, bias, 5, net)
    y = x @ weight.T + bias
    h = net(y[:, :5])  # with the subclass's or the hooks' effect
    torch.testing.assert_close(z[:, 5:], (y[:, 5:] + h[:, 0::2]) * torch.sigmoid(h[:, 1::2] + SCALE_OFFSET))
    torch.testing.assert_close(z_nograd, z.detach())


@pytest.mark.parametrize("upstream", ["expanded", "zero-dz", "zero-dlogdet"])
def test_torch_training_step_takes_any_upstream_gradient(upstream):
    results = []
    for op in (folded_affine_step, folded_affine_step_ref):
        torch.manual_seed(0)
        x, weight, bias = _inputs(9, 14, torch.float64)
        weight.requires_grad_()
        net = _mlp(7, 14, torch.float64)
        with use_backend("torch"):
            z, logdet = op(x, weight, bias, 7, net)
            loss = {"expanded": z.sum() + logdet.sum(), "zero-dz": logdet.square().sum(),
                    "zero-dlogdet": z.square().sum()}[upstream]
            results.append(torch.autograd.grad(loss, [weight, *net.parameters()]))
    for fused, ref in zip(*results):
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-12)


def test_torch_training_step_in_bfloat16():
    """16-bit activations: the log-det comes back in float32 and its gradient flows through the
    hand-written backward in the activations' dtype."""
    grads = _check_torch_training_step(67, 48, 1, torch.bfloat16)
    assert all(grad.dtype == torch.bfloat16 for grad in grads.values())
