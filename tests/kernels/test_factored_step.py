"""The affine step of small-batch training in one autograd node (`flowcore.kernels.factored_step`)
against its composed twin `factored_affine_step_ref` in float64, with the factors applied as whole
triangles and on their block split, and against float64 in float32 and bfloat16."""
import pytest
import torch

from flowcore.kernels import factored_affine_step, factored_affine_step_ref, triangular

from helpers.kernel_checks import assert_as_accurate_as_ref, coupling_mlp


@pytest.fixture(params=["whole", "blocked"])
def factor_layout(request, monkeypatch):
    monkeypatch.setattr(triangular, "BLOCK_WIDTH", 1 << 30 if request.param == "whole" else 3)
    return request.param


def _step(rows, d, dtype=torch.float64, depth=3, width=8, seed=0):
    """(inputs, conditioner): x, loc, logs, lu, log_s, sign, perm, split and an MLP, all drawn in
    float64 then cast, so every dtype gets the same values."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape, std=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * std).to(dtype).requires_grad_()

    split = d // 2
    net = coupling_mlp(split, 2 * (d - split), dtype, depth, width, generator)
    sign = torch.where(torch.rand(d, generator=generator) < 0.5, -1.0, 1.0).to(dtype)
    inputs = [draw(rows, d), draw(d, std=0.5), draw(d, std=0.3), draw(d, d, std=0.2), draw(d, std=0.3), sign,
              torch.randperm(d, generator=generator), split]
    return inputs, net


def _run(op, inputs, net, cotangents):
    z, logdet = op(*inputs, net)
    leaves = [t for t in (*inputs[:5], *net.parameters())]
    grads = torch.autograd.grad((z, logdet), leaves, [c.to(z.dtype) for c in cotangents[:1]] +
                                [cotangents[1].to(logdet.dtype)])
    return z, logdet, grads


@pytest.mark.parametrize("rows, d", [(1, 2), (3, 3), (5, 7), (32, 64), (17, 383), (4, 390)])
def test_factored_step_matches_its_composed_twin(factor_layout, rows, d):
    """z, the whole log-det (coupling + ActNorm + LU) and the gradient of x, loc, logs, lu, log_s
    and each MLP parameter equal the composed twin's in float64."""
    inputs, net = _step(rows, d, seed=d)
    generator = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(rows, d, generator=generator, dtype=torch.float64),
                  torch.randn(rows, generator=generator, dtype=torch.float64)]
    z, logdet, grads = _run(factored_affine_step, inputs, net, cotangents)
    assert type(z.grad_fn).__name__ == "_FactoredAffineStepBackward"
    z_ref, logdet_ref, grads_ref = _run(factored_affine_step_ref, inputs, net, cotangents)
    torch.testing.assert_close(z, z_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logdet, logdet_ref, rtol=1e-12, atol=1e-12)
    assert len(grads) == 5 + 6
    for grad, grad_ref in zip(grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-10 * max(1.0, grad_ref.abs().max().item()))


@pytest.mark.parametrize("dtype, d", [(torch.float32, 200), (torch.float32, 390), (torch.bfloat16, 96)])
def test_factored_step_in_low_precision_is_as_accurate_as_its_twin(dtype, d):
    """Against float64: the fused step's error stays within the composed twin's own (1e-5 of the
    largest value in float32; at most twice the twin's error in bfloat16)."""
    rows = 32
    generator = torch.Generator().manual_seed(2)
    cotangents = [torch.randn(rows, d, generator=generator, dtype=torch.float64),
                  torch.randn(rows, generator=generator, dtype=torch.float64)]
    results = {}
    for label, op, run_dtype in (("fused", factored_affine_step, dtype), ("ref", factored_affine_step_ref, dtype),
                                 ("float64", factored_affine_step_ref, torch.float64)):
        inputs, net = _step(rows, d, run_dtype, seed=5)
        results[label] = _run(op, inputs, net, cotangents)
    if dtype == torch.bfloat16:
        names = ["z", "logdet", "x", "loc", "logs", "lu", "log_s", *(f"net {i}" for i in range(6))]
        for name, fused, ref, exact in zip(names, *(
                [results[label][0], results[label][1], *results[label][2]] for label in ("fused", "ref", "float64"))):
            assert_as_accurate_as_ref(fused, ref, exact, name, factor=2.0)
        assert results["fused"][1].dtype == torch.float32  # the log-det accumulates in float32
        return
    for fused, exact in zip([results["fused"][0], results["fused"][1], *results["fused"][2]],
                            [results["float64"][0], results["float64"][1], *results["float64"][2]]):
        scale = exact.abs().max().item()
        torch.testing.assert_close(fused.double(), exact, rtol=0, atol=1e-5 * max(scale, 1.0))


def test_factored_step_has_exact_second_order_gradients():
    """Under create_graph the backward differentiates the composed twin: gradcheck and gradgradcheck."""
    inputs, net = _step(4, 6, seed=3)
    function = lambda *args: factored_affine_step(*args, *inputs[5:], net)  # noqa: E731
    assert torch.autograd.gradcheck(function, tuple(inputs[:5]))
    assert torch.autograd.gradgradcheck(function, tuple(inputs[:5]))


def test_frozen_inputs_get_no_gradient_and_the_rest_still_match():
    inputs, net = _step(3, 10, seed=4)
    inputs[0].requires_grad_(False)
    net[0].requires_grad_(False)
    z, logdet = factored_affine_step(*inputs, net)
    leaves = [*inputs[1:5], *(p for p in net.parameters() if p.requires_grad)]
    grads = torch.autograd.grad(z.sum() + logdet.sum(), leaves)
    z_ref, logdet_ref = factored_affine_step_ref(*inputs, net)
    grads_ref = torch.autograd.grad(z_ref.sum() + logdet_ref.sum(), leaves)
    for grad, grad_ref in zip(grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-10)


def test_other_conditioners_and_torch_func_run_the_composed_twin():
    inputs, net = _step(3, 8, seed=6)
    z, _ = factored_affine_step(*inputs, lambda y1: net(y1))
    assert type(z.grad_fn).__name__ != "_FactoredAffineStepBackward"
    torch.testing.assert_close(z, factored_affine_step_ref(*inputs, net)[0], rtol=0, atol=0)
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
    jacobian = torch.func.jacrev(lambda logs: factored_affine_step(*detached[:2], logs, *detached[3:], net)[1])(
        detached[2])
    expected = torch.autograd.functional.jacobian(
        lambda logs: factored_affine_step_ref(*detached[:2], logs, *detached[3:], net)[1], detached[2])
    torch.testing.assert_close(jacobian, expected, rtol=1e-12, atol=1e-12)


def test_a_conditioner_of_the_wrong_width_is_named():
    inputs, _ = _step(3, 8, seed=7)
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 6)).double()
    with pytest.raises(ValueError, match="conditioner output must have 8 columns, got 6"):
        factored_affine_step(*inputs, wrong)
