"""The run's check of its calibration against its first steps: the drift check of ``calibrate_drift``.

Calibration (:mod:`hybridflow.runtime.calibration`) measures the run's models before the plan is compiled, or reads
a cached profile, possibly one measured at another load level of the machine. The run then measures itself: its
span recorder times every op. After :data:`CHECK_STEPS` steps past the warm-up step, :func:`check_calibration`
sets the median measured step against the plan's predicted step (:func:`~.step_analysis.step_timing`, as
``hybridflow explain`` does) and settles each cached profile (:func:`~hybridflow.runtime.calibration.settle_profile`):
kept (and, borrowed from another load level, stored for this one) when the ratio is within a factor of
``1 + calibrate_drift``, else dropped so that the next start measures again. The plan that is running is not
changed: a run's plan is fixed once it starts (its ops are in flight); the check decides what the next start reads.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..compiler.profiling import Profile
from ..runtime.spans import Span
from .step_analysis import step_timing

log = logging.getLogger("hybridflow.trainer")

__all__ = ["CHECK_STEPS", "DriftCheck", "drift_check", "check_calibration"]

CHECK_STEPS = 3
"""Steps measured for the check, after the warm-up step (iteration 0: first calls, allocations)."""


@dataclass(frozen=True)
class DriftCheck:
    """The check's verdict: the median measured step over the predicted one, and whether it is beyond the bound."""

    ratio: float
    drifted: bool


def drift_check(plan, spans: Iterable[Span], drift: float) -> DriftCheck | None:
    """The verdict on iterations 1..CHECK_STEPS of ``spans``; None until they have all been recorded, or when the
    plan predicts no time. ``drift``: the bound, a factor of ``1 + drift`` either way."""
    measured = [s for s in spans if 1 <= s.iteration <= CHECK_STEPS]
    if not any(s.iteration == CHECK_STEPS for s in measured):
        return None
    step = step_timing(plan, measured)
    if not step.predicted_s or step.median_s is None:
        return None
    ratio = step.median_s / step.predicted_s
    return DriftCheck(ratio, not (1.0 / (1.0 + drift) <= ratio <= 1.0 + drift))


def check_calibration(plan, spans: Sequence[Span], profiles: Sequence[tuple[Profile, bool]],
                      drift: float | None) -> DriftCheck | None:
    """Run the drift check once its steps are recorded and settle the run's cached profiles; the verdict, or None
    (not yet, no check asked for, or no profile to check)."""
    if drift is None or not profiles:
        return None
    verdict = drift_check(plan, spans, drift)
    if verdict is None:
        return None
    from ..runtime.calibration import settle_profile

    said = [line for profile, _ in profiles if (line := settle_profile(profile, verdict.drifted))]
    if verdict.drifted:
        log.warning("calibrate: steps 1-%d took %.2fx the predicted step (beyond calibrate_drift=%g)%s", CHECK_STEPS,
                    verdict.ratio, drift, "; " + "; ".join(said) if said else "")
    else:
        log.info("calibrate: steps 1-%d took %.2fx the predicted step (within calibrate_drift=%g)%s", CHECK_STEPS,
                 verdict.ratio, drift, "; " + "; ".join(said) if said else "")
    return verdict
