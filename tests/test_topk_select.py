"""Tests for empirics.kernels.topk_select: the compiled row-wise top-m equals torch.topk (benchmarks/RESULTS.md §4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.kernels import topk_select
from dictcheck.empirics.kernels.topk_select import ALIKE_ROWS, encoder_topk, row_blocks, row_topk


def _matrix(seed: int, n: int, d: int, dtype: torch.dtype, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: many equal entries, also at the m-th place
        return torch.randint(-3, 4, (n, d), generator=g).to(dtype)
    return (torch.randn(n, d, generator=g, dtype=torch.float64) * torch.rand(n, 1, generator=g, dtype=torch.float64)).to(dtype)


def _assert_same_selection(a: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, m: int) -> None:
    """Values = torch.topk's exactly (descending); columns distinct, holding those values, and
    among equal values the lowest columns (the documented tie order)."""
    ref = torch.topk(a, m, dim=1)
    assert torch.equal(vals, ref.values)
    assert torch.equal(a.gather(1, idx), vals)
    assert bool((torch.sort(idx, dim=1).values.diff(dim=1) > 0).all())
    for r in range(a.shape[0]):
        for v in vals[r].unique():
            held = sorted(idx[r][vals[r] == v].tolist())
            assert held == (a[r] == v).nonzero().squeeze(1).tolist()[: len(held)]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 9), st.integers(1, 300), st.integers(1, 80),
       st.sampled_from([torch.float32, torch.float64]), st.booleans())
def test_row_topk_equals_torch_topk(seed, n, d, m, dtype, ties):
    m = min(m, d)
    a = _matrix(seed, n, d, dtype, ties)
    vals, idx = row_topk(a, m)
    assert vals.dtype == dtype and idx.dtype == torch.int64 and tuple(idx.shape) == (n, m)
    _assert_same_selection(a, vals, idx, m)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 60), st.integers(1, 700), st.integers(1, 70),
       st.sampled_from([torch.float32, torch.float64]), st.sampled_from(["same", "rising", "falling", "ties"]))
def test_row_topk_is_exact_whatever_bound_the_previous_row_gives(seed, n, d, m, dtype, scales):
    """Step 1 takes the previous row's bound when m to 2m chunk maxima reach it and computes the
    row's own otherwise (module docstring). Rows of one scale mostly accept it, rows of rising
    scale see it too low (more than 2m chunks), falling scale too high (fewer than m), and integer
    rows tie at the bound: every path gives torch.topk's values and the lowest columns of ties."""
    m = min(m, d)
    g = torch.Generator().manual_seed(seed)
    if scales == "ties":
        a = torch.randint(-2, 3, (n, d), generator=g).to(dtype)
    else:
        s = {"same": torch.ones(n), "rising": torch.linspace(0.1, 10, n), "falling": torch.linspace(10, 0.1, n)}[scales]
        a = (torch.randn(n, d, generator=g, dtype=torch.float64) * s.double().unsqueeze(1)).to(dtype)
    vals, idx = row_topk(a, m)
    _assert_same_selection(a, vals, idx, m)


def test_row_topk_orders_infinities_as_numbers():
    a = torch.tensor([[0.0, float("inf"), -1.0, float("-inf"), 2.0], [float("-inf")] * 5])
    vals, idx = row_topk(a, 3)
    assert vals[0].tolist() == [float("inf"), 2.0, 0.0] and idx[0].tolist() == [1, 4, 0]
    assert idx[1].tolist() == [0, 1, 2] and bool((vals[1] == float("-inf")).all())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_row_topk_is_the_same_on_any_number_of_threads(threads):
    a = _matrix(5, 257, 1000, torch.float32, ties=False)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = row_topk(a, 17)
        torch.set_num_threads(threads)
        got = row_topk(a, 17)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 12), st.integers(1, 90), st.integers(1, 20),
       st.sampled_from([torch.float32, torch.float64]), st.sampled_from([1 << 9, 1 << 12, 1 << 23]))
def test_encoder_topk_is_row_topk_of_the_affine_map(seed, n, d_in, d, m, dtype, block_bytes):
    """Block by block (small ``_BLOCK_BYTES``: many blocks, of at least ALIKE_ROWS rows each) the
    selection is a top m of x W + b: the values are torch.topk's, and the selected entries hold
    them (to rounding here; bit for bit in the next test)."""
    m = min(m, d)
    g = torch.Generator().manual_seed(seed)
    x, W, b = (torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in ((n, d_in), (d_in, d), (d,)))
    old = topk_select._BLOCK_BYTES
    topk_select._BLOCK_BYTES = block_bytes
    try:
        vals, idx = encoder_topk(x, W, b, m)
    finally:
        topk_select._BLOCK_BYTES = old
    a = x @ W + b
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(vals, torch.topk(a, m, dim=1).values, rtol=tol, atol=tol)
    torch.testing.assert_close(a.gather(1, idx), vals, rtol=tol, atol=tol)
    assert bool((torch.sort(idx, dim=1).values.diff(dim=1) > 0).all())
    assert bool((vals.diff(dim=1) <= 0).all())


@pytest.mark.parametrize("n", [16, 100, 1000, 1001, 1017])
def test_encoder_topk_is_bit_exact_with_blocks_of_16_rows_or_more(n):
    """Blocks of ≥ 16 rows (or one block) give the values of x @ W + b in one piece bit for bit
    (MKL rounds a row alike in any product of ≥ 16 rows), so a model saved and read by another
    architecture (batchtopk as jumprelu, vasae as topk) computes the same codes. 1001 and 1017 rows
    split into blocks of 19 and 20 rows: no short last block (1001 had a 1-row one before)."""
    g = torch.Generator().manual_seed(n)
    x, W, b = torch.randn(n, 64, generator=g), torch.randn(64, 300, generator=g), torch.randn(300, generator=g)
    old = topk_select._BLOCK_BYTES
    topk_select._BLOCK_BYTES = 20 * 300 * 4  # blocks of at most 20 rows (one for n = 16)
    try:
        vals, idx = encoder_topk(x, W, b, 20)
    finally:
        topk_select._BLOCK_BYTES = old
    ref = row_topk(x @ W + b, 20)
    assert torch.equal(vals, ref[0]) and torch.equal(idx, ref[1])


@given(st.integers(1, 5000), st.integers(1, 70000), st.sampled_from([4, 8]))
def test_row_blocks_are_at_most_8_mib_at_least_16_rows_and_even(n, d, size):
    """The cuts cover 0..n; block sizes differ by at most one row; each block holds ≥ ALIKE_ROWS rows
    (one block when n is smaller) and at most one row over 8 MiB, or fewer than 2·ALIKE_ROWS rows."""
    cuts = row_blocks(n, d, size)
    sizes = [hi - lo for lo, hi in zip(cuts[:-1], cuts[1:])]
    assert cuts[0] == 0 and cuts[-1] == n and max(sizes) - min(sizes) <= 1
    assert len(sizes) == 1 or min(sizes) >= ALIKE_ROWS
    assert (max(sizes) - 1) * d * size <= 8 << 20 or max(sizes) < 2 * ALIKE_ROWS or len(sizes) == 1


def test_bad_input_is_one_line_errors():
    a = torch.zeros(3, 4)
    for m in (0, 5):
        with pytest.raises(ValueError, match="1 <= m <= d"):
            row_topk(a, m)
    with pytest.raises(ValueError, match="float32 and float64"):
        row_topk(a.half(), 2)
    with pytest.raises(ValueError, match="1 <= m <= d"):
        encoder_topk(torch.zeros(2, 3), torch.zeros(3, 4), torch.zeros(4), 5)
