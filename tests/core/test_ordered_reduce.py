"""The order-fixed gradient reduction (lab_utils/core/ordered_reduce.py, chapter 12): its pieces, and bad input."""

from __future__ import annotations

import pytest
import torch

from lab_utils.core import ordered_reduce
from lab_utils.core.config import ConfigError
from lab_utils.launch import launcher


def test_rank_order_sum_is_a_left_fold():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(10_000, generator=g) for _ in range(8)]
    expected = parts[0].clone()
    for t in parts[1:]:
        expected = expected + t
    assert torch.equal(ordered_reduce.rank_order_sum(parts), expected)
    # ... and that the order matters at all, so the test above could fail for another order
    assert not torch.equal(ordered_reduce.rank_order_sum(parts[::-1]), expected)


def test_bytes_per_rank():
    assert ordered_reduce.bytes_per_rank(100, 4, 2, "allreduce") == ordered_reduce.bytes_per_rank(100, 4, 2, "ordered")
    assert ordered_reduce.bytes_per_rank(100, 4, 8, "ordered") == 7 * 400
    assert ordered_reduce.bytes_per_rank(100, 4, 8, "allreduce") == pytest.approx(1.75 * 400)
    with pytest.raises(ValueError, match="how='ring'"):
        ordered_reduce.bytes_per_rank(100, 4, 8, "ring")


def test_bad_value_is_refused_before_launch(tmp_path):
    with pytest.raises(ConfigError, match="grad_reduction"):
        launcher.launch(launcher.request("bad", 2, ["grad_reduction=bucketwise"], runs_dir=tmp_path))
    assert not (tmp_path / "bad").exists()

# The real 4-rank runs (ordered: tier 3 against emulate_ranks=4; stock: tier 2, not bitwise) are two entries of
# the port-bug suite (lab_utils/analysis/portbugs.py, tests/analysis/test_port_bugs.py): reduction_in_backend_order,
# ordered_reduction.
