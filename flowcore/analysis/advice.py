""""Does calibration help here?": with labelled pairs, the calibration to use and why; without, `auto`'s
choice, with a warning when the neighbourhoods are already balanced (calibration then usually lowers STS Spearman)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flowcore.analysis.isotropy import Isotropy

__all__ = ["Advice", "ISOTROPY_CAVEAT", "SIMPLICITY", "TIE_MARGIN", "advise", "balanced_neighbourhoods_warning"]

TIE_MARGIN = 0.5
"""Spearman ×100 points within which a simpler calibration is preferred to the best one."""
SIMPLICITY = ("none", "center", "abtt", "whitening", "auto", "zca", "flow")
"""Calibrations from the simplest to the most complex (ties go to the simpler one)."""
ISOTROPY_CAVEAT = ("Isotropy is not quality: a calibration that makes vectors more isotropic can still lower "
                   "similarity quality (e.g. STS Spearman); judge it on labelled pairs (--pairs).")


@dataclass(frozen=True)
class Advice:
    """What to use and why.

    Attributes:
        recommended: a calibration name: by the labelled scores when there are some, else auto's
            choice ("none" or "whitening"); None without either.
        scores: {calibration: Spearman ×100 on the labelled pairs} (empty without labels).
        reason: one sentence with the numbers.
        warnings: e.g. the balanced-neighbourhoods warning.
        auto: {"choice", "signals", "reason"} of `auto` fitted on the raw corpus, None without it.
    """

    recommended: str | None
    scores: dict
    reason: str
    warnings: list
    auto: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


def balanced_neighbourhoods_warning(auto) -> str | None:
    """The warning for raw vectors whose k-NN graph `auto` (a fitted `AutoCalibration`) found
    balanced, so that it keeps them raw; None when it whitens."""
    if auto.choice != "none":
        return None
    return (f"the raw vectors' nearest neighbours are already balanced (hubness {auto.signals['hubness']:.3f} < "
            f"{auto.signals['threshold']:g}, auto's signal): calibration is unlikely to help and often lowers "
            f"similarity quality on encoders trained for similarity; check with labelled pairs (--pairs) before "
            f"using one")


def advise(isotropy: dict[str, Isotropy], scores: dict[str, float] | None = None, warnings: list[str] = (),
           auto=None) -> Advice:
    """Recommend a calibration from labelled scores, or without them by auto's rule.

    Args:
        isotropy: {calibration: `Isotropy` of the corpus after it}, "none" for the raw vectors.
        scores: {calibration: Spearman ×100 on labelled pairs}; None or empty: no labels; NaN/None: left out.
        warnings: warnings of the caller (e.g. a small fit corpus), listed first.
        auto: an `AutoCalibration` fitted on the raw corpus: without labels its choice is the
            recommendation; with labels it is reported beside theirs.

    Example:
        >>> advise(isotropy, {"none": 82.0, "whitening": 80.3, "flow": 80.5}).recommended
        'none'
        >>> advise(isotropy, auto=AutoCalibration().fit(X)).recommended     # auto's choice
        'whitening'
    """
    warnings = list(warnings)
    warning = balanced_neighbourhoods_warning(auto) if auto is not None else None
    if warning is not None:
        warnings.append(warning)
    chosen = None if auto is None else {"choice": auto.choice, "signals": dict(auto.signals), "reason": auto.reason}
    valid = {name: float(value) for name, value in (scores or {}).items()
             if value is not None and not math.isnan(value)}
    if not valid:
        if auto is None:
            return Advice(None, {}, _isotropy_change(isotropy, "No labelled pairs, so no recommendation"), warnings)
        return Advice(auto.choice, {}, _isotropy_change(isotropy, f"No labelled pairs; auto's rule, from the corpus "
                                                                   f"alone: {auto.reason}"), warnings, chosen)
    best = max(valid, key=valid.get)
    candidates = [name for name in valid if valid[name] >= valid[best] - TIE_MARGIN]
    choice = min(candidates, key=lambda name: SIMPLICITY.index(name) if name in SIMPLICITY else len(SIMPLICITY))
    ranked = ", ".join(f"{name} {valid[name]:.2f}" for name in sorted(valid, key=valid.get, reverse=True))
    if choice == best:
        reason = f"{choice} scores best on the labelled pairs (Spearman x100: {ranked})"
    else:
        reason = f"{choice} is within {TIE_MARGIN:g} points of the best, {best} (Spearman x100: {ranked}), and simpler"
    if choice == "none" and len(valid) > 1:
        reason += "; calibration does not help this encoder here"
    if auto is not None:
        reason += f"; without labels, auto would choose {auto.reason}"
    return Advice(choice, valid, reason + ".", warnings, chosen)


def _isotropy_change(isotropy: dict[str, Isotropy], lead: str) -> str:
    raw = isotropy.get("none")
    cosine, iso = (f"{raw.mean_cosine:.3f} -> ", f"{raw.isoscore:.3f} -> ") if raw is not None else ("", "")
    parts = [f"{name}: mean random-pair cosine {cosine}{after.mean_cosine:.3f}, IsoScore {iso}{after.isoscore:.3f}"
             for name, after in isotropy.items() if name != "none"]
    return f"{lead}; isotropy " + "; ".join(parts) + "." if parts else f"{lead}."
