"""Chapter 11's box decisions as pure functions of what a box reports, so a CPU box tests a T4's, two T4s' and
a one-GPU box's answers: amp=bf16 refused below compute capability 8.0 (even when torch says bf16 is supported,
through emulation), the GPU link read from `nvidia-smi topo -m`, when the P2P probe runs, and the device a
careful user's script picks for LOCAL_RANK (the outside script chapter 10 runs). The probes themselves run for
real on the H200 (scripts/device/h200_amp.sh)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from lab_utils.core import config
from lab_utils.launch import launcher, preflight

T4, A100, H200 = (7, 5), (8, 0), (9, 0)

# `nvidia-smi topo -m` as printed on two T4s of a hosted notebook (PCIe through the host bridge) and on two
# H200s of the device machine (18 NVLinks), legends cut.
TOPO_T4 = """\
\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tPHB\t0-3\t0\t\tN/A
GPU1\tPHB\t X \t0-3\t0\t\tN/A

Legend:
  X    = Self
"""
TOPO_H200 = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tSYS\t0-47\t0\t\tN/A
NIC0\tSYS\tSYS\t X \t\t\t
"""


def test_bf16_is_refused_below_capability_8_and_the_message_names_fp16():
    assert config.bf16_refusal([H200]) is None and config.bf16_refusal([A100, H200]) is None
    for caps in ([T4], [T4, T4], [H200, T4]):
        msg = config.bf16_refusal(caps)
        assert msg and "amp=fp16" in msg and "7.5" in msg and "8.0" in msg, caps


def test_the_preflight_line_ignores_torchs_emulated_bf16_flag():
    """A T4 reports is_bf16_supported() True (emulation): the decision still refuses, and says why."""
    line = preflight.bf16_line([T4], torch_says=True)
    assert line.startswith("not native") and "emulation" in line and "amp=fp16" in line, line
    assert preflight.bf16_line([H200], torch_says=True) == "native (capability 9.0)"
    assert preflight.bf16_line([], None).startswith("no GPU")


def test_bf16_on_a_t4_is_refused_before_launch(monkeypatch, tmp_path):
    """The launcher validates the keys against the box before anything starts: a T4 (as torch reports one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: T4)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    with pytest.raises(config.ConfigError, match="amp=bf16 needs native bf16.*use amp=fp16"):
        launcher.launch(launcher.request("t4_bf16", 1, ["amp=bf16", "steps=1"], runs_dir=tmp_path, progress=False))
    assert not (tmp_path / "t4_bf16").exists()  # refused before the run folder was written
    config.resolve(["amp=fp16", "steps=1"], 1)  # fp16 is what a T4 runs
    config.resolve(["amp=bf16", "device=cpu"], 1)  # on the CPU bf16 is not gated


def test_gpu_link_reads_the_topology_matrix():
    t4 = preflight.gpu_link(TOPO_T4, 2)
    assert t4.startswith("PCIe, no NVLink") and "GPU0-GPU1 (PHB" in t4, t4
    assert preflight.gpu_link(TOPO_H200, 2) == "NVLink (NV18) between every pair"
    assert preflight.gpu_link(None, 2).startswith("unknown")
    assert preflight.gpu_link(TOPO_H200, 1).startswith("1 GPU(s)")


def test_the_p2p_probe_runs_only_with_two_gpus_and_nccl():
    assert preflight.p2p_skip_reason(1, True).startswith("skipped: 1 GPU(s)")
    assert preflight.p2p_skip_reason(0, True).startswith("skipped: 0 GPU(s)")
    assert preflight.p2p_skip_reason(2, False) == "skipped: this torch has no NCCL"
    assert preflight.p2p_skip_reason(2, True) is None


def _outside_script():
    path = Path(__file__).resolve().parents[1] / "outside" / "multigpu_torchrun_recorded.py"
    spec = importlib.util.spec_from_file_location("outside_recorded", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module level only: main() runs under `if __name__ == "__main__"`
    return module


def test_the_outside_script_puts_two_ranks_of_a_one_gpu_box_on_the_cpu():
    """The original picked cuda:LOCAL_RANK whenever CUDA was present: rank 1 of 2 on one GPU died with
    'invalid device ordinal' (16 failed cells on the one-GPU H200, chapter 10)."""
    pick = _outside_script().pick_device
    assert pick(1, 2, 1) == "cpu" and pick(0, 2, 1) == "cpu"  # one GPU, two ranks: both on CPU, gloo
    assert pick(0, 1, 1) == "cuda:0"  # the single run uses the GPU
    assert pick(1, 2, 2) == "cuda:1" and pick(0, 2, 0) == "cpu"
