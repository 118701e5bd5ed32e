"""How far to trust a server step on few updates: the fleet's agreement, learned step by step.

A step on one or two updates of a label-skewed fleet leans toward those devices' few classes,
while on a fleet whose devices hold similar data one update is nearly as good as ten. The difference is
how much the updates agree. Each step with two or more updates measures it: the squared norm of
the mean direction (the signal) and the variance of one update around it (the noise), both per
local step as FedNova weighs them. Their ratio `rho` over the recent steps says how much an
average of n updates is worth: with noise sigma^2 / n, the mean-square-optimal scaling of the
average is n rho / (n rho + 1) (shrinkage toward no step). A step on n updates is scaled by
that against a full step's (n = clients-per-round):

    scale = (n / K) * (K rho + 1) / (n rho + 1)      (1 when n >= K; n / K when rho = 0)

so agreeing fleets barely thin, disagreeing ones thin steps on few updates almost in proportion.
Until two steps have measured it, nothing is thinned.

Agreement is about the devices' data, so it is measured on updates that arrive close to what was
computed: float32 or at least `FAITHFUL_BITS` wide. A 2-bit update (three levels) can be rounded
by about as much as it measures, and error feedback sends what was rounded away in the device's
later jobs: counted here, that rounding would read as disagreement and thin steps for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from edgesched.core.aggregate import Update, fednova_shares, momentum_steps

FAITHFUL_BITS = 4  # the narrowest width whose updates measure agreement (0, float32, always does)


def spread(updates: Sequence[Update], momentum: float, exponent: float) -> tuple[float, float] | None:
    """(signal, noise) of one step's updates, or None for a step that cannot measure it (fewer
    than two updates sent float32 or at least FAITHFUL_BITS wide).

    Directions are deltas per unit of local work; weights are FedNova's (data size x staleness
    discount). Signal: the squared norm of the weighted mean, less the noise it carries; noise:
    the weighted variance of one direction around the mean, corrected for the effective count.
    """
    updates = [u for u in updates if u.bits == 0 or u.bits >= FAITHFUL_BITS]
    shares = fednova_shares(updates, exponent) if len(updates) >= 2 else None
    if shares is None:
        return None
    n_eff = 1.0 / float(shares @ shares)
    if n_eff <= 1.0 + 1e-9:
        return None
    flat = np.stack([np.concatenate([np.ravel(t) for t in u.delta]).astype(np.float64)
                     / momentum_steps(u.steps, momentum) for u in updates])
    mean = shares @ flat
    noise = float(shares @ np.sum((flat - mean) ** 2, axis=1)) * n_eff / (n_eff - 1.0)
    signal = max(0.0, float(mean @ mean) - noise / n_eff)
    return signal, noise


class Agreement:
    """The recent steps' signal-to-noise ratio, and the share of a full step n updates earn."""

    def __init__(self, window: int = 10) -> None:
        self._steps: deque[tuple[float, float]] = deque(maxlen=window)

    def observe(self, measured: tuple[float, float] | None) -> None:
        if measured is not None and np.isfinite(measured).all():
            self._steps.append(measured)

    @property
    def rho(self) -> float | None:
        """Signal over noise, summed over the window (None until two steps measured it)."""
        noise = sum(n for _, n in self._steps)
        if len(self._steps) < 2 or noise <= 0:
            return None
        return sum(s for s, _ in self._steps) / noise

    def scale(self, updates: int, wanted: int) -> float:
        """What share of a full step (`wanted` updates) a step on `updates` updates is worth."""
        rho = self.rho
        if rho is None or updates >= wanted:
            return 1.0
        return (updates / wanted) * (wanted * rho + 1.0) / (updates * rho + 1.0)
