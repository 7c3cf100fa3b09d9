"""Grouped kernel for the low-bit integer types of a cpu_gemv.Group: IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S (gemv_iq's grid decode) and Q2_K, Q3_K (gemv_int's decode).

These have no SIMD group kernel; `gemv` runs them through the portable kernels gemv_int / gemv_iq
of cpu_gemv_kern, which read the same per-256 int8 activations as the SIMD kernels (xq, xd, and
xs for Q2_K's mins), so a group quantizes x once for all of them. `gemv_lowbit_group` runs all
such matrices of a group in ONE parallel loop over row chunks balanced by bytes (as
gemv_simd_group / gemv_tq_group), each row through the row bodies of gemv_int / gemv_iq
(make_row_int / make_row_iq over a dispatch of only these six decoders: about half the compile
time of all ten, the same code per type, bit-identical rows).
"""
from __future__ import annotations

import numba
from numba import njit, prange

from tightfit.kernels import cpu_gemv_kern as _K
from tightfit.kernels.cpu_gemv_kern import IQ2_S, IQ2_XS, IQ3_S, IQ3_XXS, Q2_K, Q3_K

#: types gemv_lowbit_group runs
LOWBIT_TYPES = (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, Q2_K, Q3_K)
_GRID_TYPES = (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)


def iq_tuple(iq: dict) -> tuple:
    """cpu_gemv._IQ (type -> (g64, m64, p16)) as the one tuple argument of gemv_lowbit_group:
    (g64, m64) of IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S in that order."""
    return tuple(a for qt in _GRID_TYPES for a in iq[qt][:2])


@njit(inline="always")
def _decode_low(qt, w, buf, mins, tab):
    if qt == Q3_K:
        return _K._dec_q3_k(w, buf, mins, tab)
    return _K._dec_q2_k(w, buf, mins, tab)


@njit(inline="always")
def _iqdec_grid(qt, w, b64, sc, g64, m64, p16):
    if qt == IQ2_XS:
        return _K._iqdec_iq2_xs(w, b64, sc, g64, m64, p16)
    if qt == IQ2_S:
        return _K._iqdec_iq2_s(w, b64, sc, g64, m64, p16)
    if qt == IQ3_XXS:
        return _K._iqdec_iq3_xxs(w, b64, sc, g64, m64, p16)
    return _K._iqdec_iq3_s(w, b64, sc, g64, m64, p16)


_row_int = _K.make_row_int(_decode_low)
_row_iq = _K.make_row_iq(_iqdec_grid)


@njit(inline="always")
def _rows_iq(qt, w, r0, r1, col, ts, xq, xd, y, tab, g64, m64, a):
    b8, b64, sc, sc64, acc = a
    for r in range(r0, r1):
        _row_iq(qt, w[r], ts, xq, xd, tab, g64, m64, g64, b8, b64, sc, sc64, acc)
        for b in range(xq.shape[0]):
            y[b, col + r] = acc[b]


@njit(parallel=True, fastmath=True, cache=True)
def gemv_lowbit_group(ws, qts, ycol, cm, cr0, cr1, xq, xd, xs, y, tab, iqt,
                      sbuf, smin, sb8, sb64, ssc, ssc64, sacc):
    """ws a typed List of raw (M_m, row_bytes_m) matrices of LOWBIT_TYPES, qts[m] their types,
    ycol[m] the first output column of matrix m in y (B, n_out); the work a list of row chunks
    (cm[c]: matrix, rows cr0[c]..cr1[c]). xq/xd/xs as for gemv_int, iqt = iq_tuple(...); the
    per-thread scratch rows as for gemv_int (sbuf, smin, sacc) and gemv_iq (sb8/sb64, ssc/ssc64)."""
    B = xq.shape[0]
    nb = xq.shape[1] // 256
    for c in prange(cm.shape[0]):
        m = cm[c]
        w = ws[m]
        qt = qts[m]
        col = ycol[m]
        ts = w.shape[1] // nb
        tid = numba.get_thread_id()
        acc = sacc[tid]
        if qt == Q2_K or qt == Q3_K:
            for r in range(cr0[c], cr1[c]):
                _row_int(qt, w[r], ts, xq, xd, xs, tab, sbuf[tid], smin[tid], acc)
                for b in range(B):
                    y[b, col + r] = acc[b]
        else:   # one loop per type, its type a literal: the decoder dispatch folds away
            a = (sb8[tid], sb64[tid], ssc[tid], ssc64[tid], acc)
            if qt == IQ2_XS:
                _rows_iq(IQ2_XS, w, cr0[c], cr1[c], col, ts, xq, xd, y, tab, iqt[0], iqt[1], a)
            elif qt == IQ2_S:
                _rows_iq(IQ2_S, w, cr0[c], cr1[c], col, ts, xq, xd, y, tab, iqt[2], iqt[3], a)
            elif qt == IQ3_XXS:
                _rows_iq(IQ3_XXS, w, cr0[c], cr1[c], col, ts, xq, xd, y, tab, iqt[4], iqt[5], a)
            else:
                _rows_iq(IQ3_S, w, cr0[c], cr1[c], col, ts, xq, xd, y, tab, iqt[6], iqt[7], a)
