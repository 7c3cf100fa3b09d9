"""Make the Lloyd-Max codebooks of the TurboQuant-style KV formats (tightfit/kvquant/formats.py).

    python3 scripts/kv_codebooks.py            # prints the CODEBOOKS constant to paste

Model of the data. A K or V head row x (D = head_dim values) is rotated by a fixed randomized
Walsh-Hadamard transform, y = R x; y is cut into blocks of G values and each block is stored as
its norm plus one code per value. For a block b, u = sqrt(G) * y_b / |y_b| lies on the sphere of
radius sqrt(G) in G dimensions; after a random rotation its direction is (close to) uniform, so
each coordinate t = u_i has the density

    f_G(t) ∝ (1 - t²/G)^((G-3)/2),   |t| < sqrt(G)      (the scaled Beta law of spec §6.1;
                                                          -> N(0, 1) as G grows)

The codebook of b bits is the Lloyd-Max quantizer of f_G with 2^b levels: alternate
"thresholds = midpoints of neighbouring levels" and "level = E[t | its cell]" until the levels stop
moving (1e-12). Integrals are sums over a fine grid (2^21 points) of the density, so the tables
are accurate to ~1e-7, far below the float32 rounding of the constants. The script also prints
the mean squared error per coordinate, E[(t - Q(t))²] (for G -> inf this is the classical
Gaussian Lloyd-Max figure: 0.1175, 0.03454, 0.009497 for 2, 3, 4 bits).
"""
from __future__ import annotations

import numpy as np

GROUPS = (32, 128)
BITS = (2, 3, 4)
GRID = 1 << 21


def density(G: int) -> tuple[np.ndarray, np.ndarray]:
    lim = np.sqrt(G)
    t = np.linspace(-lim, lim, GRID + 1)[1:-1]
    w = np.power(np.clip(1.0 - t * t / G, 0.0, None), (G - 3) / 2.0)
    return t, w / w.sum()


def lloyd_max(t: np.ndarray, w: np.ndarray, levels: int, iters: int = 5000) -> tuple[np.ndarray, float]:
    # start from the quantiles of the distribution (cell centres in probability)
    cdf = np.cumsum(w)
    c = np.interp((np.arange(levels) + 0.5) / levels, cdf, t)
    for _ in range(iters):
        mids = 0.5 * (c[1:] + c[:-1])
        cell = np.searchsorted(mids, t)
        mass = np.bincount(cell, weights=w, minlength=levels)
        new = np.bincount(cell, weights=w * t, minlength=levels) / mass
        new = 0.5 * (new - new[::-1])           # the law is symmetric: keep the table antisymmetric
        if np.max(np.abs(new - c)) < 1e-12:
            c = new
            break
        c = new
    mids = 0.5 * (c[1:] + c[:-1])
    mse = float(np.sum(w * (t - c[np.searchsorted(mids, t)]) ** 2))
    return c, mse


def main() -> None:
    print("CODEBOOKS = {   # (group, bits): Lloyd-Max levels of f_G (scripts/kv_codebooks.py)")
    mses = {}
    for G in GROUPS:
        t, w = density(G)
        for b in BITS:
            c, mse = lloyd_max(t, w, 1 << b)
            mses[(G, b)] = mse
            vals = ", ".join(f"{v:.7f}" for v in c)
            print(f"    ({G}, {b}): ({vals}),")
    print("}")
    print("CODEBOOK_MSE = {   # E[(t - Q(t))^2] per coordinate, t ~ f_G (unit variance)")
    for k, v in mses.items():
        print(f"    {k}: {v:.6f},")
    print("}")


if __name__ == "__main__":
    main()
