""""Does calibration help here?": with labelled pairs, the calibration to use and why; without, what
calibration does to isotropy, and a warning when the vectors are already close to isotropic.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flowcore.analysis.isotropy import Isotropy

__all__ = ["Advice", "ISOTROPY_CAVEAT", "NEAR_ISOTROPIC_COSINE", "SIMPLICITY", "TIE_MARGIN", "advise",
           "near_isotropic_warning"]

TIE_MARGIN = 0.5
"""Spearman ×100 points within which a simpler calibration is preferred to the best one."""
SIMPLICITY = ("none", "center", "abtt", "whitening", "zca", "flow")
"""Calibrations from the simplest to the most complex (ties go to the simpler one)."""
NEAR_ISOTROPIC_COSINE = 0.1
"""A mean random-pair cosine below this means the vectors are already close to isotropic."""
ISOTROPY_CAVEAT = ("Isotropy is not quality: a calibration that makes vectors more isotropic can still lower "
                   "similarity quality (e.g. STS Spearman); judge it on labelled pairs (--pairs).")


@dataclass(frozen=True)
class Advice:
    """What to use and why.

    Attributes:
        recommended: a calibration name, or None when there are no labels to decide by.
        scores: {calibration: Spearman ×100 on the labelled pairs} (empty without labels).
        reason: one sentence with the numbers.
        warnings: e.g. the near-isotropic warning.
    """

    recommended: str | None
    scores: dict
    reason: str
    warnings: list

    def to_json(self) -> dict:
        return asdict(self)


def near_isotropic_warning(raw: Isotropy) -> str | None:
    """The warning for raw vectors whose mean random-pair cosine is below `NEAR_ISOTROPIC_COSINE`."""
    if abs(raw.mean_cosine) >= NEAR_ISOTROPIC_COSINE:
        return None
    return (f"the raw vectors are already close to isotropic (mean random-pair cosine {raw.mean_cosine:.3f} < "
            f"{NEAR_ISOTROPIC_COSINE}): calibration is unlikely to help and often lowers similarity quality on "
            f"encoders trained for similarity; check with labelled pairs (--pairs) before using it")


def advise(isotropy: dict[str, Isotropy], scores: dict[str, float] | None = None,
           margin: float = TIE_MARGIN, warnings: list[str] = ()) -> Advice:
    """Recommend a calibration from labelled scores, or describe the isotropy change without them.

    Args:
        isotropy: {calibration: `Isotropy` of the corpus after it}, "none" for the raw vectors.
        scores: {calibration: Spearman ×100 on labelled pairs}; None or empty: no labels; NaN/None: left out.
        margin: a simpler calibration within this many points of the best one is recommended.
        warnings: warnings of the caller (e.g. a small fit corpus), listed first.

    Example:
        >>> advise(isotropy, {"none": 82.0, "whitening": 80.3, "flow": 80.5}).recommended
        'none'
    """
    warnings = list(warnings)
    raw = isotropy.get("none")
    warning = near_isotropic_warning(raw) if raw is not None else None
    if warning is not None:
        warnings.append(warning)
    valid = {name: float(value) for name, value in (scores or {}).items()
             if value is not None and not math.isnan(value)}
    if not valid:
        return Advice(None, {}, _isotropy_change(isotropy), warnings)
    best = max(valid, key=valid.get)
    candidates = [name for name in valid if valid[name] >= valid[best] - margin]
    choice = min(candidates, key=lambda name: SIMPLICITY.index(name) if name in SIMPLICITY else len(SIMPLICITY))
    ranked = ", ".join(f"{name} {valid[name]:.2f}" for name in sorted(valid, key=valid.get, reverse=True))
    if choice == best:
        reason = f"{choice} scores best on the labelled pairs (Spearman x100: {ranked})"
    else:
        reason = (f"{choice} is within {margin:g} points of the best, {best} (Spearman x100: {ranked}), "
                  f"and simpler")
    if choice == "none" and len(valid) > 1:
        reason += "; calibration does not help this encoder here"
    return Advice(choice, valid, reason + ".", warnings)


def _isotropy_change(isotropy: dict[str, Isotropy]) -> str:
    raw = isotropy.get("none")
    parts = []
    for name, after in isotropy.items():
        if name == "none":
            continue
        before = f"{raw.mean_cosine:.3f} -> " if raw is not None else ""
        iso = f"{raw.isoscore:.3f} -> " if raw is not None else ""
        parts.append(f"{name}: mean random-pair cosine {before}{after.mean_cosine:.3f}, IsoScore {iso}"
                     f"{after.isoscore:.3f}")
    if not parts:
        return "No labelled pairs: no recommendation."
    return "No labelled pairs, so no recommendation; isotropy " + "; ".join(parts) + "."
