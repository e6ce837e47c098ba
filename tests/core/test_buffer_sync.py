"""DDP's buffer sync (the lab key `broadcast_buffers`): which torch argument the wrap passes, that a 2-rank run logs
no deprecation warning from torch's DDP, what each argument copies at the wrap (the wrap probe, real torchrun),
and when DDP copies rank 0's buffers under accumulation: the emulated reference must give every emulated rank
the running stats the real ranks end with (rank 1 included, which no parity comparison looks at)."""

import re

import pytest
import torch

from lab_utils.core import checkpoint, ddp, runfiles, workloads
from lab_utils.core import config as config_mod
from lab_utils.launch import launcher, probes

BN = ["model=bn_net", "steps=6", "global_batch_size=32", "grad_accum_steps=2", "no_sync=true"]


class _OldDDP:
    """A DDP signature without forward_sync_buffers, as torch before 2.13 has (for the fallback only)."""

    def __init__(self, module, device_ids=None, broadcast_buffers=True, find_unused_parameters=False):
        pass


def test_buffer_sync_kwargs_feature_detect_the_torch_argument():
    assert ddp.buffer_sync_kwargs(False, _OldDDP) == {"broadcast_buffers": False}
    name = "forward_sync_buffers" if ddp.has_forward_sync_buffers() else "broadcast_buffers"
    assert ddp.buffer_sync_kwargs(True) == {name: True}


@pytest.fixture(scope="module")
def bn_runs(tmp_path_factory):
    """bn_net with accumulation 2 and no_sync: a real 2-rank run, and its emulation with a final checkpoint
    (which stores every emulated rank's own buffers)."""
    d = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_RUNS_DIR", str(d))
        launcher.launch(launcher.request("bn_ddp", 2, BN, timeout=300, progress=False)).raise_for_status()
        launcher.launch(launcher.request("bn_emu", 1, BN + ["emulate_ranks=2", "checkpoint_every=6"], timeout=300,
                                         progress=False)).raise_for_status()
    return d


@pytest.mark.slow
def test_two_rank_log_has_no_deprecation_warning_from_ddp(bn_runs):
    run = bn_runs / "bn_ddp"
    logs = [run / "output.log", *sorted((run / "logs").rglob("*.log"))]
    text = "\n".join(p.read_text(errors="replace") for p in logs if p.is_file())
    assert "[train] world_size=2" in text  # the logs are the run's, not empty files
    ddp_words = ("parallel/distributed.py", "lab_utils/core/ddp.py", "DistributedDataParallel", "DDP", "buffers")
    bad = [ln for ln in text.splitlines() if re.search(r"FutureWarning|DeprecationWarning", ln)
           and any(w in ln for w in ddp_words)]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_emulated_ranks_end_with_the_real_ranks_running_stats(bn_runs):
    """DDP copies rank 0's buffers before the FIRST micro-batch of a no_sync window (the forward after a
    synchronising one), not before the last: emulated rank 1's running stats must equal real rank 1's, bit for
    bit. (An emulation that broadcasts before the synchronising micro-batch fails here, on rank 1 only.)"""
    beats = runfiles.read_heartbeats(bn_runs / "bn_ddp")
    state = checkpoint.load_checkpoint(checkpoint.checkpoint_path(bn_runs / "bn_emu", 6))
    cfg = config_mod.resolve(BN, 2)
    names = [n for n, _ in workloads.build(cfg).model.named_buffers()]
    assert len(state["rank_buffers"]) == 2
    for r in (0, 1):
        emulated = dict(zip(names, state["rank_buffers"][r], strict=True))
        real = beats[r]["running_stats"]
        assert real, f"rank {r} wrote no running stats"
        for name, values in real.items():
            assert torch.equal(emulated[name].double(), torch.tensor(values, dtype=torch.float64)), (r, name)
    # the check can fail: rank 1's stats are not rank 0's (each rank's last micro-batch is its own)
    assert beats[0]["running_stats"] != beats[1]["running_stats"]


@pytest.mark.slow
def test_wrap_probe_measures_both_buffer_arguments(runs_dir):
    """What each argument copies at the wrap, on a rank whose buffers differ from rank 0's, and which warns."""
    probe = probes.launch_wrap_probe("wrap", 2, seed=42, backend="auto")
    before = probe[1]["before"]["buffers"]
    assert before != probe[0]["before"]["buffers"]
    old_on, old_off = probe[1]["broadcast_buffers=True"], probe[1]["broadcast_buffers=False"]
    assert old_on["buffers"] == probe[0]["before"]["buffers"] and old_off["buffers"] == before
    if not ddp.has_forward_sync_buffers():
        assert "forward_sync_buffers=False" not in probe[1]
        return
    for flag in (True, False):  # the current argument copies rank 0's buffers at the wrap either way
        rec = probe[1][f"forward_sync_buffers={flag}"]
        assert rec["buffers"] == probe[0]["before"]["buffers"] and rec["warnings"] == []
    assert any("FutureWarning" in w for w in old_off["warnings"])
