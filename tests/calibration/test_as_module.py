"""`Calibrator.as_module()`: every method's forward-only torch module equals its `transform` to float32
rounding, holds no inverse or linear-algebra op, and traces with torch.export."""
import numpy as np
import pytest
import torch

import flowcore
from flowcore.calibration.modules import FlowMap, LinearMap, Passthrough
from flowcore.flows.forward import GlowForward
from flowcore.flows.glow import Glow

LINEAR = {
    "whitening": lambda: flowcore.Whitening(),
    "whitening-8": lambda: flowcore.Whitening(keep=8),
    "tempered": lambda: flowcore.Whitening(power=0.25),
    "zca": lambda: flowcore.ZCAWhitening(),
    "center": lambda: flowcore.MeanCentering(),
    "abtt": lambda: flowcore.AllButTheTop(k=2),
    "none": lambda: flowcore.calibration.create("none"),
    "auto": lambda: flowcore.calibration.create("auto"),
}


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(600, 24)) @ rng.normal(size=(24, 24)) + 2.0).astype(np.float32)


def _agree(calibrator, X) -> torch.nn.Module:
    module = calibrator.as_module()
    got = module(torch.from_numpy(X)).numpy()
    want = calibrator.transform(X)
    assert got.dtype == np.float32 and got.shape == want.shape == (len(X), calibrator.output_dim)
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, float(np.abs(want).max())), rtol=0)
    return module


@pytest.mark.parametrize("method", LINEAR)
def test_linear_methods(vectors, method):
    calibrator = LINEAR[method]().fit(vectors)
    module = _agree(calibrator, vectors)
    kept = method == "none" or (method == "auto" and calibrator.choice == "none")
    assert isinstance(module, Passthrough if kept else LinearMap)


def test_auto_whitening_choice_is_a_linear_map():
    rng = np.random.default_rng(3)  # one dominant direction: hubness high, auto whitens
    X = (rng.normal(size=(800, 16)) * np.geomspace(30, 0.1, 16) + 50.0).astype(np.float32)
    calibrator = flowcore.calibration.create("auto", threshold=0.01).fit(X)
    assert calibrator.choice == "whitening"
    assert isinstance(_agree(calibrator, X), LinearMap)


@pytest.mark.parametrize("config, settings", [("l2_d2_w32", {}), ("l3_d2_w32", {"recipe": "standardized"}),
                                              ("l2_d2_w32", {"recipe": "paper"}),
                                              ("l2_d2_w32", {"standardize": False})],
                         ids=["whitened", "standardized-3-levels", "paper", "raw"])
def test_the_flow(vectors, config, settings):
    calibrator = flowcore.FlowCalibrator(config, epochs=2, **settings).fit(vectors, show_progress_bar=False)
    assert isinstance(_agree(calibrator, vectors), FlowMap)


def test_constant_coordinates_pass_through_centred(vectors):
    X = vectors.copy()
    X[:, [3, 17]] = [1.5, -2.0]
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=2).fit(X, show_progress_bar=False)
    assert calibrator.standardizer.flow_dim == 22
    module = _agree(calibrator, X)
    assert module.bypass
    np.testing.assert_array_equal(module(torch.from_numpy(X))[:, [3, 17]].numpy(), 0.0)


@pytest.mark.parametrize("coupling, permutation", [("additive", "reverse"), ("affine", "reverse"),
                                                   ("additive", "lu")])
def test_glow_variants(coupling, permutation):
    torch.manual_seed(0)
    glow = Glow(24, levels=3, depth=2, width=16, coupling=coupling, permutation=permutation).eval()
    with torch.no_grad():
        for parameter in glow.parameters():
            parameter.normal_(0, 0.1)
    x = torch.randn(50, 24)
    torch.testing.assert_close(GlowForward(glow)(x), glow(x)[0], atol=1e-5, rtol=1e-5)


def test_the_module_is_plain_ops_and_traces(vectors):
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=1).fit(vectors, show_progress_bar=False)
    module = calibrator.as_module()
    assert not any(p.requires_grad for p in module.parameters()) and not list(module.parameters())
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (torch.from_numpy(vectors[:4]),), dynamic_shapes=({0: batch},))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("linalg" in target or "triangular" in target or "inverse" in target for target in targets)
    np.testing.assert_allclose(program.module()(torch.from_numpy(vectors[:7])).numpy(),
                               calibrator.transform(vectors[:7]), atol=1e-5)


def test_unfitted_calibrators_are_refused():
    for make in LINEAR.values():
        with pytest.raises(ValueError, match="fit"):
            make().as_module()
    with pytest.raises(RuntimeError, match="not fitted"):
        flowcore.FlowCalibrator().as_module()


def test_a_saved_and_loaded_calibrator_gives_the_same_module(vectors, tmp_path):
    calibrator = flowcore.Whitening(keep=6).fit(vectors)
    calibrator.save(tmp_path / "w.flow")
    loaded = flowcore.load(tmp_path / "w.flow").as_module()
    torch.testing.assert_close(loaded(torch.from_numpy(vectors)), calibrator.as_module()(torch.from_numpy(vectors)))
