"""What the placed-model tests share: the small 4-layer Q8_0 model with its reference, a plan with
host rows where the test says, and the tolerance check against the reference."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np


def small_q8(tmp_path_factory, tag: str, seed: int, **kw) -> Iterator:
    """Generator for a module-scoped fixture: (path, model file, reference model)."""
    from tightfit.api import open_model
    from tightfit.model.generate import make_model
    from tightfit.model.reference import ReferenceModel
    p = tmp_path_factory.mktemp(tag) / "small-q8.gguf"
    make_model(p, preset="small", layers=4, qtype="Q8_0", seed=seed, **kw)
    mf = open_model(p)
    yield p, mf, ReferenceModel.from_model_file(mf)
    mf.close()


def split_plan(path, ctx: int, host_rows: Callable[[object], dict], **kw):
    """The full plan of `path` with host rows {tensor: rows} = host_rows(inventory)."""
    from tightfit.model.placed import replace_host_rows
    from tightfit.plan.budget import PlanOptions, plan_model
    from tightfit.plan.placement import inventory_from_gguf
    inv = inventory_from_gguf(path)
    full = plan_model(inv, PlanOptions(ctx=ctx, available=1 << 34, reserve=0, prefill_chunk=16,
                                       host_embd="no"))
    return replace_host_rows(full, host_rows(inv), **kw)


def ladder_rows(kinds: tuple[str, ...], layers: int = 4) -> Callable[[object], dict]:
    """host_rows for split_plan: the `kinds` input matrices of every layer split at one or two
    row quanta (alternating by layer), blk.1's ffn_down wholly on the host (a host point without a
    GPU prefix), the head with half its quanta on the host."""
    from tightfit.plan.rowsplit import SPLIT_ROW_QUANTUM as Q

    def host_rows(inv) -> dict:
        rows = {}
        for il in range(layers):
            for k in kinds:
                t = inv.tensors.get(f"blk.{il}.{k}.weight")
                if t is not None:
                    rows[t.name] = Q * (1 + il % 2)
        rows["blk.1.ffn_down.weight"] = inv.tensors["blk.1.ffn_down.weight"].n_rows
        V = inv.tensors["output.weight"].n_rows
        rows["output.weight"] = V - V // Q // 2 * Q
        return rows
    return host_rows


def close(a, b, tol: float = 3e-4) -> None:
    a, b = np.asarray(a.detach().cpu(), np.float64), np.asarray(b.detach().cpu(), np.float64)
    err = np.abs(a - b).max()
    assert err <= tol * (np.abs(b).max() + 1e-9), f"max err {err}, scale {np.abs(b).max()}"
