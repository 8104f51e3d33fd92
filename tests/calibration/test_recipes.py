"""Fit recipes: the whitened start is exactly whitening, held-out likelihood chooses the epoch (the
start included), the paper's recipe stays available, and the recipe is saved with the flow."""
import numpy as np
import pytest
import torch

import flowcore
from flowcore.calibration.recipes import RECIPES, FlowRecipe, recipe_named
from flowcore.sts.metrics import cosine_similarity

torch.set_num_threads(1)


def anisotropic(rows: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    """Gaussian rows with a strong common offset and very unequal variances (a narrow cone)."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) @ np.diag(np.geomspace(5, 0.1, dim)) @ rng.normal(size=(dim, dim))
            + 3).astype(np.float32)


def pair_cosines(vectors: np.ndarray) -> np.ndarray:
    return cosine_similarity(vectors[0::2], vectors[1::2])


def test_recipes_by_name_with_overrides():
    assert RECIPES["paper"] == FlowRecipe("paper", input="raw", lr=1e-3, batch_size=32, epochs=1)
    assert recipe_named("whitened").input == "whiten" and recipe_named("whitened").holdout > 0
    assert recipe_named("paper", epochs=2, lr=None).epochs == 2 and recipe_named("paper", lr=None).lr == 1e-3
    with pytest.raises(ValueError, match="unknown flow recipe 'best'; choose one of whitened, standardized, paper"):
        recipe_named("best")
    with pytest.raises(ValueError, match="holdout must be in"):
        recipe_named("whitened", holdout=1.0)
    assert (recipe_named("whitened").evaluations_per_epoch, recipe_named("whitened").patience) == (4, 2)
    assert recipe_named("whitened", patience=5).patience == 5
    with pytest.raises(ValueError, match="evaluations_per_epoch and patience must be >= 1"):
        recipe_named("whitened", patience=0)
    with pytest.raises(ValueError, match="unknown flow input 'sphere'"):
        recipe_named("paper", input="sphere")


@pytest.mark.parametrize("drop_direction", [False, True])
def test_the_linear_start_is_whitening(drop_direction):
    """Before training, the whitened start's cosines are BERT-whitening's (to the 1e-3 of each
    level's last coupling scale, `LINEAR_START_SCALE`), also when a direction has no variance
    (whitening drops it, the flow passes it near zero)."""
    data = anisotropic(400)
    if drop_direction:
        data[:, -1] = data[:, 0] + data[:, 1]  # rank 7: one direction without variance
    whitening = flowcore.Whitening().fit(data)
    assert whitening.output_dim == (7 if drop_direction else 8)
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=1, lr=1e-12, holdout=0.25).fit(data,
                                                                                            show_progress_bar=False)
    Z = calibrator.transform(data)
    np.testing.assert_allclose(pair_cosines(Z), pair_cosines(whitening.transform(data)), atol=2e-3)
    assert np.abs(np.cov(Z, rowvar=False)[:7, :7] - np.eye(7)).max() < 0.05 or drop_direction
    raw = flowcore.FlowCalibrator("l2_d2_w32", recipe="standardized", epochs=1, lr=1e-12).fit(data,
                                                                                              show_progress_bar=False)
    assert np.abs(pair_cosines(raw.transform(data)) - pair_cosines(whitening.transform(data))).max() > 0.05


def test_glow_start_linear_is_the_given_map_up_to_a_rotation():
    torch.manual_seed(0)
    glow = flowcore.Glow(6, levels=2, depth=2, width=8)
    weight, loc = torch.randn(6, 6, dtype=torch.float64) + 3 * torch.eye(6, dtype=torch.float64), torch.randn(6)
    glow.start_linear(weight, loc).eval()
    x = torch.randn(50, 6)
    with torch.no_grad():
        z, logdet = glow(x)
    linear = ((x.double() + loc.double()) @ weight.T).float()
    np.testing.assert_allclose(pair_cosines(z.numpy()), pair_cosines(linear.numpy()), atol=2e-3)
    np.testing.assert_allclose(z.norm(dim=1).numpy(), linear.norm(dim=1).numpy(), rtol=2e-3)
    assert all(bool(m.initialized) for m in glow.modules() if hasattr(m, "initialized"))
    with pytest.raises(ValueError, match=r"expects a \(6, 6\) weight"):
        glow.start_linear(torch.eye(5))


def test_heldout_likelihood_keeps_the_start_when_training_does_not_help():
    """On Gaussian rows whitening is already the maximum-likelihood flow: training cannot beat it
    on held-out rows, so after `patience` evaluations (4 an epoch) training stops early, the start
    (epoch 0) is kept, the result is whitening, and the outcome says so in one line."""
    data = anisotropic(600, seed=1)
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=3, lr=3e-2, batch_size=16).fit(data,
                                                                                            show_progress_bar=False)
    scores, steps = calibrator.heldout_bits_per_dim, 34  # 540 training rows, batch 16
    assert calibrator.selected_epoch == 0 and len(scores) == 3 and min(scores[1:]) > scores[0]
    assert calibrator.heldout_epochs == [0, 9 / steps, 18 / steps]  # evaluated every ceil(34 / 4) = 9 steps
    assert calibrator.stopped_early and len(calibrator.losses) == 1  # the part of the first epoch trained
    assert calibrator.outcome.startswith(
        "kept the whitening start: no trained state was better on held-out data (stopped after 0.529 of at most 3 "
        "epochs: 2 evaluations in a row without a better held-out score); ")
    assert calibrator.outcome.endswith(" s")
    whitening = flowcore.Whitening().fit(data)
    np.testing.assert_allclose(pair_cosines(calibrator.transform(data)), pair_cosines(whitening.transform(data)),
                               atol=2e-3)
    patient = flowcore.FlowCalibrator("l2_d2_w32", epochs=1, lr=3e-2, batch_size=16, patience=10).fit(
        data, show_progress_bar=False)
    assert patient.heldout_epochs == [0, 9 / steps, 18 / steps, 27 / steps, 1] and not patient.stopped_early
    assert patient.selected_epoch == 0 and patient.outcome.startswith(
        "kept the whitening start: no trained state was better on held-out data (trained the full 1 epoch); ")


def test_heldout_likelihood_keeps_training_while_it_improves(tmp_path):
    """On rows on a curved manifold the flow beats whitening's held-out likelihood: training goes
    on, trained weights are kept, and the scores, where they were taken and the recipe are saved
    with the flow."""
    rng = np.random.default_rng(2)
    t = rng.uniform(-2, 2, size=(1500, 4))
    data = np.concatenate([t, t ** 2 + 0.05 * rng.normal(size=t.shape)], axis=1).astype(np.float32)
    calibrator = flowcore.FlowCalibrator("l2_d2_w32", epochs=2, lr=3e-3, batch_size=32).fit(data,
                                                                                            show_progress_bar=False)
    scores, kept = calibrator.heldout_bits_per_dim, calibrator.selected_epoch
    assert kept >= 1 and scores[calibrator.heldout_epochs.index(kept)] < scores[0] - 0.05
    assert len(scores) > 4 and len(calibrator.losses) >= 1
    assert calibrator.outcome.startswith(f"kept the flow trained {kept:.3g} epochs: held-out ")
    assert "against the whitening start's" in calibrator.outcome
    calibrator.save(tmp_path / "m.flow")
    loaded = flowcore.FlowCalibrator.load(tmp_path / "m.flow")
    assert loaded.recipe == calibrator.recipe and loaded.recipe.name == "whitened"
    assert loaded.heldout_bits_per_dim == scores and loaded.selected_epoch == kept
    assert loaded.heldout_epochs == calibrator.heldout_epochs and loaded.stopped_early == calibrator.stopped_early
    assert loaded.fit_seconds is None and loaded.outcome == calibrator.outcome.rpartition(";")[0]
    np.testing.assert_array_equal(loaded.transform(data), calibrator.transform(data))


def test_the_papers_recipe_is_raw_input_without_selection(tmp_path):
    data = anisotropic(300)
    paper = flowcore.FlowCalibrator("l2_d2_w32", recipe="paper").fit(data, show_progress_bar=False)
    assert paper.standardizer is None and paper.heldout_bits_per_dim == [] and paper.selected_epoch is None
    assert (paper.epochs, paper.batch_size, paper.lr, paper.standardize) == (1, 32, 1e-3, False)
    paper.save(tmp_path / "paper.flow")
    assert flowcore.FlowCalibrator.load(tmp_path / "paper.flow").recipe == RECIPES["paper"]


def test_files_from_before_recipes_are_refused_with_how_to_refit(tmp_path):
    from flowcore.calibration.file import CalibratorFileError, read_calibrator_file, write_calibrator_file

    data = anisotropic(300)
    flowcore.FlowCalibrator("l2_d2_w32", recipe="standardized").fit(data,
                                                                    show_progress_bar=False).save(tmp_path / "new.flow")
    tensors, info = read_calibrator_file(tmp_path / "new.flow")
    for key in ("recipe", "heldout_bits_per_dim", "selected_epoch"):
        del info["training"][key]
    del info["kind"]  # as such files were written
    write_calibrator_file(tmp_path / "old.flow", tensors, info)
    with pytest.raises(CalibratorFileError, match=r"old.flow: a flow file from an earlier flowcore \(before fit "
                                                  r"recipes\), which this one does not read; refit the flow with "
                                                  r"`flowcore fit`"):
        flowcore.load(tmp_path / "old.flow")
