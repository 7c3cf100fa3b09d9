"""Random raw GGUF blocks on a torch device, shared by the GEMV device tests (gemv_cuda, gemv_mma,
PDL chains): random bytes with every fp16 scale field set to 1e-3..1e-2, so outputs stay finite."""
from __future__ import annotations

import torch

from tightfit.quant.traits import F16_SCALE_OFFSETS as F16_FIELDS, traits


def rand_weights(t: int, n_out: int, n_in: int, seed: int, device: str = "cuda") -> torch.Tensor:
    """n_out rows of n_in weights of GGML type t as one flat uint8 tensor."""
    tr = traits(t)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    raw = torch.randint(0, 256, (n_out * (n_in // tr.block_size), tr.type_size), dtype=torch.uint8,
                        device=device, generator=g)
    for off in F16_FIELDS[t]:
        sc = (torch.rand(raw.shape[0], device=device, generator=g) * 0.009 + 0.001).half()
        raw[:, off:off + 2] = sc.view(torch.uint8).view(-1, 2)
    return raw.view(-1)
