"""Every layer and every Glow configuration kind passes the shared flow contract."""
import pytest
import torch

from flowcore.flows.actnorm import ActNorm
from flowcore.flows.coupling import Coupling
from flowcore.flows.glow import CONFIGS, Glow
from flowcore.flows.invertible_linear import LULinear, ReversePermutation
from flowcore.flows.step import FlowStep

from helpers.contract import (
    check_every_parameter_gets_gradient,
    check_inverse_logdet,
    check_logdet_matches_jacobian,
    check_round_trip,
    check_save_load,
    randomize,
)

DIM = 13  # odd on purpose


def layer_factories():
    yield "actnorm", lambda: ActNorm(DIM)
    yield "lu_linear", lambda: LULinear(DIM)
    yield "reverse", lambda: ReversePermutation(DIM)
    for kind in ("affine", "additive"):
        yield f"coupling_{kind}", lambda kind=kind: Coupling(DIM, width=8, kind=kind)
        for permutation in ("lu", "reverse"):
            yield f"step_{permutation}_{kind}", lambda k=kind, p=permutation: FlowStep(DIM, 8, k, p)
    for name, config in CONFIGS.items():
        yield f"glow_{name}", lambda config=config: Glow(16, **{**config, "width": 8})
    for coupling in ("affine", "additive"):
        for permutation in ("lu", "reverse"):
            yield f"glow_odd_{coupling}_{permutation}", lambda c=coupling, p=permutation: Glow(
                DIM, levels=2, depth=2, width=8, coupling=c, permutation=p)


FACTORIES = dict(layer_factories())


def inverse_logdet_of(layer):
    if isinstance(layer, Glow):
        return lambda z: layer.inverse(z, return_logdet=True)[1]
    return lambda z: layer.inverse(z)[1]


def build(name, dtype, std=0.3):
    torch.manual_seed(3)
    layer = randomize(FACTORIES[name]().to(dtype), std=std)
    width = layer.dim if hasattr(layer, "dim") else DIM
    return layer, width


@pytest.mark.parametrize("name", FACTORIES)
def test_round_trip_float64(name):
    layer, width = build(name, torch.float64)
    check_round_trip(layer, torch.randn(9, width, dtype=torch.float64) * 2 + 1, tolerance=1e-9)


@pytest.mark.parametrize("name", FACTORIES)
def test_round_trip_float32(name):
    layer, width = build(name, torch.float32, std=0.1)  # keep W well conditioned for float32
    check_round_trip(layer, torch.randn(9, width) * 2 + 1, tolerance=2e-4)


@pytest.mark.parametrize("name", FACTORIES)
def test_logdet_equals_slogdet_of_jacobian(name):
    layer, width = build(name, torch.float64)
    check_logdet_matches_jacobian(layer, torch.randn(3, width, dtype=torch.float64))


@pytest.mark.parametrize("name", FACTORIES)
def test_inverse_logdet_is_equal_and_opposite(name):
    layer, width = build(name, torch.float64)
    check_inverse_logdet(layer, inverse_logdet_of(layer), torch.randn(5, width, dtype=torch.float64))


@pytest.mark.parametrize("name", [n for n in FACTORIES if n != "reverse"])
def test_every_parameter_gets_a_gradient(name):
    layer, width = build(name, torch.float64)
    check_every_parameter_gets_gradient(layer, torch.randn(6, width, dtype=torch.float64))


@pytest.mark.parametrize("name", FACTORIES)
def test_save_load_round_trip(name, tmp_path):
    layer, width = build(name, torch.float64)
    x = torch.randn(6, width, dtype=torch.float64)
    check_save_load(layer, FACTORIES[name], x, tmp_path / "layer.flow")


@pytest.mark.parametrize("name", ["actnorm", "step_lu_affine", "glow_l2_d3_w32"])
def test_save_load_keeps_actnorm_initialised(name, tmp_path):
    layer, width = build(name, torch.float64)
    layer.train()
    layer(torch.randn(50, width, dtype=torch.float64) * 3 + 5)  # data-dependent init happens here
    loaded = check_save_load(layer.eval(), FACTORIES[name], torch.randn(4, width, dtype=torch.float64),
                             tmp_path / "layer.flow")
    before = {n: p.clone() for n, p in loaded.named_parameters()}
    loaded.train()
    loaded(torch.randn(50, width, dtype=torch.float64) * 100)  # must not re-initialise
    for n, p in loaded.named_parameters():
        assert torch.equal(p, before[n]), f"{n} was re-initialised after loading"
