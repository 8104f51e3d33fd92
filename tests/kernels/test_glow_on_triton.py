"""A whole Glow on backend `triton` (interpreter on CPU) equals the same Glow on backend `torch`:
forward, log-det, every parameter gradient, inverse, log_prob, the eval fast path and `fit`."""
import copy

import pytest
import torch

import flowcore
from flowcore.backend import use_backend

from helpers.contract import randomize
from helpers.launches import triton_launches

DIM = 48


def _glow(dtype, **kwargs):
    torch.manual_seed(0)
    glow = flowcore.Glow(DIM, **{"levels": 2, "depth": 2, "width": 16, **kwargs})
    return randomize(glow, std=0.05).to(dtype)  # well-conditioned mixing: round trips stay exact


def _data(rows, dtype, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, DIM, generator=generator) * 1.5 + 0.7).to(dtype)


def _tolerance(dtype):
    return {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 2e-4, "atol": 2e-4}


def _assert_gradients_equal(a, b, tolerance):
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert (pa.grad is None) == (pb.grad is None), name
        if pa.grad is not None:
            scale = max(pb.grad.abs().max().item(), 1.0)
            torch.testing.assert_close(pa.grad / scale, pb.grad / scale, **tolerance, msg=f"gradient of {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("coupling,permutation", [("affine", "lu"), ("additive", "lu"), ("affine", "reverse"),
                                                  ("additive", "reverse")])
def test_glow_training_pass_and_inverse_match_between_backends(dtype, coupling, permutation):
    reference = _glow(dtype, coupling=coupling, permutation=permutation)
    fused = copy.deepcopy(reference)
    x = _data(67, dtype)
    tolerance = _tolerance(dtype)

    with use_backend("torch"):
        z_ref, logdet_ref = reference(x)
        (z_ref.square().sum() - logdet_ref.sum()).backward()
    with use_backend("triton"), triton_launches() as counts:
        z, logdet = fused(x)
        (z.square().sum() - logdet.sum()).backward()
    launched = set(counts)
    if permutation == "lu":  # the Triton step: ActNorm + 1x1 folded, the coupling in the second GEMM's epilogue
        expected = {"_folded_gemm_kernel"} | ({"_affine_bwd_kernel"} if coupling == "affine" else set())
        assert not {"_actnorm_fwd_kernel", "_affine_fwd_kernel"} & launched, launched
    else:  # ActNorm, the reversal, the coupling (the additive one is one torch add)
        expected = {"_actnorm_fwd_kernel", "_actnorm_bwd_kernel"}
        expected |= {"_affine_fwd_kernel", "_affine_bwd_kernel"} if coupling == "affine" else set()
    assert expected <= launched, f"Triton kernels not launched: {expected - launched}"

    torch.testing.assert_close(z, z_ref, **tolerance)
    torch.testing.assert_close(logdet, logdet_ref, **tolerance)
    _assert_gradients_equal(fused, reference, tolerance)

    with torch.no_grad():
        with use_backend("torch"):
            x_ref = reference.inverse(z_ref)
            log_prob_ref = reference.log_prob(x)
        with use_backend("triton"):
            x_back = fused.inverse(z_ref)
            log_prob = fused.log_prob(x)
    torch.testing.assert_close(x_back, x_ref, **tolerance)
    torch.testing.assert_close(x_back, x, **tolerance)
    torch.testing.assert_close(log_prob, log_prob_ref, **tolerance)


def test_glow_eval_fast_path_uses_the_fused_step_kernel():
    reference = _glow(torch.float32)
    with torch.no_grad():
        reference(_data(64, torch.float32))  # initialise the ActNorms
    reference.eval()
    fused = copy.deepcopy(reference)
    x = _data(300, torch.float32, seed=4)
    with torch.no_grad():
        with use_backend("torch"):
            z_ref, logdet_ref = reference(x)
        with use_backend("triton"), triton_launches() as launched:
            z, logdet = fused(x)
        assert dict(launched) == {"_folded_gemm_kernel": 2 * 4}  # per step: y1's GEMM, y2's with the coupling
    torch.testing.assert_close(z, z_ref, rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(logdet, logdet_ref, rtol=2e-4, atol=2e-4)


def test_fit_gives_the_same_losses_and_weights_on_both_backends():
    reference = _glow(torch.float64)
    fused = copy.deepcopy(reference)
    data = _data(96, torch.float64, seed=5).numpy()
    with use_backend("torch"):
        losses_ref = flowcore.fit(reference, data, epochs=2, batch_size=32, lr=1e-3, seed=0, show_progress_bar=False)
    with use_backend("triton"):
        losses = flowcore.fit(fused, data, epochs=2, batch_size=32, lr=1e-3, seed=0, show_progress_bar=False)
    assert len(losses) == 2 and losses[1] < losses[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(losses_ref), rtol=1e-9, atol=1e-9)
    for (name, pa), (_, pb) in zip(fused.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-8, atol=1e-8, msg=f"parameter {name} after fit")
