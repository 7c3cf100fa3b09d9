"""tightfit/kernels/rht.py: the in-register randomized Hadamard rotation against the dense
float64 product with the workspace's R (kvquant.formats.rotation_matrix), forward and transposed,
on fresh random rows; and the one-row-from-the-index-bits construction against formats.hadamard."""
import _interp

_interp.interpret_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from tightfit.kernels import rht  # noqa: E402
from tightfit.kvquant.formats import hadamard, rotation_matrix  # noqa: E402

DEV = _interp.device(rht)


@pytest.mark.parametrize("D", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("transpose", [False, True])
def test_rotate_matches_dense_product(D, transpose):
    g = torch.Generator().manual_seed(D + transpose)
    x = torch.randn(5, D, generator=g) * torch.exp(torch.randn(5, 1, generator=g))
    x[0, 3] = 40.0                                    # an outlier coordinate, as K rows have
    R = rotation_matrix(D, dtype=torch.float32)
    y = rht.rotate_rows(x.to(DEV), R.to(DEV), transpose).cpu().double()
    want = rht.rotate_rows_ref(x, R, transpose)
    # fp32 sums of the D terms +-x_k / sqrt(D), in another order than the dense product: the
    # classic bound D u sum_k |x_k| / sqrt(D) per row (u = 2^-24)
    tol = (D * 2.0 ** -24 * x.abs().sum(1, keepdim=True).double() / D ** 0.5)
    assert ((y - want).abs() <= tol).all()
    # and the rotation is the asked-for one, not its transpose (R is not symmetric)
    other = rht.rotate_rows_ref(x, R, not transpose)
    assert (y - other).abs().max().item() > 100 * tol.max().item()


@pytest.mark.parametrize("D", [4, 16, 64, 256, 512])
def test_split_and_sign_pattern(D):
    A = rht.hadamard_split(D)
    B = D // A
    assert A * B == D and A <= B and B <= 4 * A
    H = hadamard(D)
    i = torch.arange(D)
    # the Kronecker split the kernel uses: H_D[cB + d, aB + b] = H_A[c, a] H_B[d, b]
    ha, hb = hadamard(A), hadamard(B)
    kron = ha[(i // B)[:, None], (i // B)[None, :]] * hb[(i % B)[:, None], (i % B)[None, :]]
    assert torch.equal(H, kron)


@pytest.mark.parametrize("D", [0, 3, 12, 2])
def test_split_refuses_other_sizes(D):
    with pytest.raises(ValueError, match="power-of-two"):
        rht.hadamard_split(D)
