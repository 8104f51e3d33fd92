"""The contract every transform passes: round trip, exact log-det, inverse log-det, gradients,
save/load. Used by test_flow_contract.py for each layer and for whole Glows."""
from __future__ import annotations

import torch

from flowcore.calibration.file import read_calibrator_file, write_calibrator_file


def randomize(module: torch.nn.Module, std: float = 0.3, seed: int = 1) -> torch.nn.Module:
    """Move every parameter off its identity-like initialisation, so nothing is trivially exact."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.add_((std * noise).to(parameter.dtype))
    return module


def check_round_trip(layer, x: torch.Tensor, tolerance: float) -> None:
    z, _ = layer(x)
    inverse = layer.inverse(z)
    x_back = inverse[0] if isinstance(inverse, tuple) else inverse
    error = (x_back - x).abs().max().item()
    scale = max(1.0, x.abs().max().item())
    assert error <= tolerance * scale, f"round trip error {error:.3e} > {tolerance:.1e}"


def check_logdet_matches_jacobian(layer, x: torch.Tensor) -> None:
    """log|det dz/dx| of every row equals slogdet of the autograd Jacobian (float64)."""
    _, logdet = layer(x)
    for row in range(x.shape[0]):
        jacobian = torch.autograd.functional.jacobian(lambda v: layer(v.unsqueeze(0))[0][0], x[row])
        sign, expected = torch.linalg.slogdet(jacobian)
        assert sign.item() != 0
        torch.testing.assert_close(logdet[row], expected, rtol=1e-9, atol=1e-9)


def check_inverse_logdet(layer, inverse_logdet, x: torch.Tensor) -> None:
    z, logdet = layer(x)
    back = inverse_logdet(z)
    torch.testing.assert_close(back, -logdet, rtol=1e-9, atol=1e-9)


def check_every_parameter_gets_gradient(layer, x: torch.Tensor) -> None:
    z, logdet = layer(x)
    ((z**2).sum() - logdet.sum()).backward()
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
        assert parameter.grad.abs().sum() > 0, f"{name} got an all-zero gradient"


def check_save_load(layer, make_layer, x: torch.Tensor, path) -> torch.nn.Module:
    write_calibrator_file(path, layer.state_dict(), {"kind": type(layer).__name__})
    tensors, info = read_calibrator_file(path)
    assert info == {"kind": type(layer).__name__}
    loaded = make_layer().to(x.dtype)
    loaded.load_state_dict(tensors)
    loaded.train(layer.training)
    with torch.no_grad():
        expected_z, expected_logdet = layer(x)
        z, logdet = loaded(x)
    assert torch.equal(z, expected_z) and torch.equal(logdet, expected_logdet)
    return loaded
