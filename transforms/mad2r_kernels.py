"""MAD2R round-2 preprocessing from round-1 noisy weights (MAD paper Alg. 4 lines 10-14), pure."""
from __future__ import annotations

from typing import Optional


def round2_bias(noisy_w1: float, rho2: float, sigma1: float, c_lb: float, c_ub: float) -> Optional[float]:
    """Bias b(i) of an item NOT released in round 1, or None if round 2 drops it.

    line 11: w_ub = w~1 + C_ub * sigma_1; line 12: U_low = {w_ub < rho_2} (dropped, line 13);
    line 10: w_lb = max(0, w~1 - C_lb * sigma_1); line 14: b = min(1, rho_2 / w_lb) (b = 1 when
    w_lb = 0, the limit of rho_2 / w_lb).
    """
    if noisy_w1 + c_ub * sigma1 < rho2:  # Alg. 4 lines 11-13
        return None
    w_lb = max(0.0, noisy_w1 - c_lb * sigma1)  # Alg. 4 line 10
    if w_lb <= rho2:
        return 1.0  # line 14 with rho_2 / w_lb >= 1 (or w_lb = 0)
    return rho2 / w_lb  # line 14, in (0, 1)
