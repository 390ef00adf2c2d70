"""Fit the polynomial of ``cb::fast_gelu`` (circbuf/lowering/prelude.py).

erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a / 2), a >= 0 (the form of Numerical
Recipes' erfcc: exp(-a^2) carries the Gaussian tail, t the 1/a factor). P is a
degree-5 polynomial in t fitted to g(t) = log(erfc(a) / t) + a^2 over a in
[0, 9.5] (beyond, gelu's h is below 2^-126 and flushed) by iteratively
reweighted least squares on a Chebyshev basis, which drives it toward the
minimax fit; |P - g| is the relative error of erfc. Prints P's max error and
Q = log2(e) P - 1 (base 2, the 1/2 of h = erfc / 2 folded in) as float32
constants, highest degree first, as the prelude's Horner steps use them.

Usage: python scripts/fit_fast_gelu.py   (~20 s on a CPU)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.polynomial import chebyshev as C

DEG = 5
P_T = 0.5  # t = 1 / (1 + P_T a)
A_MAX = 9.5


def fit(deg=DEG, p=P_T, a_max=A_MAX, n=200001, iters=200):
    a = np.linspace(0.0, a_max, n)
    t = 1.0 / (1.0 + p * a)
    g = np.log(torch.special.erfc(torch.from_numpy(a)).numpy() / t) + a * a
    lo, hi = t.min(), 1.0
    u = (2 * t - lo - hi) / (hi - lo)
    w = np.ones_like(u)
    for _ in range(iters):
        c = C.chebfit(u, g, deg, w=w)
        r = C.chebval(u, c) - g
        w = w * (1 + 4 * np.abs(r) / np.abs(r).max())
        w /= w.max()
    in_u = np.polynomial.Polynomial(C.cheb2poly(c))
    poly = in_u(np.polynomial.Polynomial([-(lo + hi) / (hi - lo), 2 / (hi - lo)]))
    return poly, float(np.abs(poly(t) - g).max())


def main():
    poly, err = fit()
    print(f"P (low to high): {[float(x) for x in poly.coef]}")
    print(f"max |P - g| = {err:.3e} = 2^{math.log2(err):.2f} (relative error of erfc)")
    q = [c * math.log2(math.e) for c in poly.coef]
    q[0] -= 1.0
    print("Q as float32, highest degree first:", [float(np.float32(x)) for x in reversed(q)])


if __name__ == "__main__":
    main()
