"""2-rank gloo integration: the headline claims of chapter 01, with the tiny GPT, 40 steps.

The port bugs (doubled global batch and the rest) are tests/analysis/test_port_bugs.py's table.
"""
import pytest

from lab_utils.analysis import parity
from lab_utils.launch import launcher

pytestmark = pytest.mark.slow  # every test here starts processes (see tests/conftest.py)


def test_tier2_single_vs_two_ranks_and_tier3_against_emulation(runs_dir):
    keys = ["steps=40"]
    for name, nproc, extra in [("single", 1, []), ("ddp2", 2, []), ("emu2", 1, ["emulate_ranks=2"])]:
        launcher.launch(launcher.request(name, nproc, keys + extra, timeout=300, progress=False)).raise_for_status()
    t2 = parity.compare(runs_dir / "single", runs_dir / "ddp2")
    assert t2.tier == 2 and t2.max_abs_loss_diff <= 1e-6 and not t2.bitwise, t2.format()
    t3 = parity.compare(runs_dir / "emu2", runs_dir / "ddp2")
    assert t3.tier == 3 and t3.bitwise and t3.max_abs_loss_diff == 0.0, t3.format()


def test_batchnorm_emulation_is_bitwise_buffers_included(runs_dir):
    """BatchNorm: the emulated reference reproduces DDP's broadcast_buffers (rank 0's running stats)."""
    keys = ["model=bn_net", "steps=10", "global_batch_size=32", "grad_accum_steps=2"]
    launcher.launch(launcher.request("bn_emu", 1, keys + ["emulate_ranks=2"], timeout=300,
                                     progress=False)).raise_for_status()
    launcher.launch(launcher.request("bn_ddp", 2, keys, timeout=300, progress=False)).raise_for_status()
    r = parity.compare(runs_dir / "bn_emu", runs_dir / "bn_ddp")
    assert r.tier == 3 and r.bitwise and "bn1.running_mean" in r.per_tensor, r.format()
