"""Each bad input exits non-zero with one line naming it, and no traceback."""
import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # every test here starts processes (see tests/conftest.py)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "lab_utils", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", [
    (["run", "--name", "x", "--nproc", "2", "stepz=3"], "unknown key 'stepz'"),
    (["run", "--name", "x", "--nproc", "2", "global_batch_size=15"], "global_batch_size=15 is not divisible"),
    (["run", "--name", "x", "steps=-2"], "steps=-2 must be >= 1"),
    (["run", "--name", "x", "steps=ten"], "steps='ten' is not an integer"),
    (["run", "--name", "x", "sampler=shuffle"], "sampler='shuffle' is not one of"),
    (["run", "--name", "x", "--nproc", "0"], "--nproc: 0 must be >= 1"),
    (["compare", "runs/nope_a", "runs/nope_b"], "no run folder with metrics.jsonl"),
    (["doctor", "runs/nope_a", "runs/nope_b", "--replay", "runs/nope_r", "runs/nope_t"], "--replay: run 'runs/nope_r'"),
])
def test_bad_input_one_line(args, fragment):
    p = cli(*args)
    assert p.returncode == 2
    assert fragment in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this box can run NCCL with 2 ranks")
def test_nccl_without_gpus():
    p = cli("run", "--name", "x", "--nproc", "2", "backend=nccl")
    assert p.returncode == 2 and "backend=nccl needs one CUDA GPU per rank" in p.stderr
    assert "Traceback" not in p.stderr


def test_run_and_compare_json(tmp_path):
    env_runs = tmp_path / "runs"
    for name in ("a", "b"):
        p = subprocess.run([sys.executable, "-m", "lab_utils", "run", "--name", name, "--quiet", "steps=4",
                            "n_samples=128"], capture_output=True, text=True, timeout=120,
                           env={**__import__("os").environ, "LAB_RUNS_DIR": str(env_runs)})
        assert p.returncode == 0, p.stdout + p.stderr
    p = cli("compare", str(env_runs / "a"), str(env_runs / "b"), "--json")
    report = json.loads(p.stdout)
    assert report["tier"] == 3 and report["bitwise"] is True  # the same run twice is deterministic
    for key in ("tier", "max_abs_loss_diff", "first_diff_step", "max_abs_param_diff", "bitwise"):
        assert key in report


def test_keys_lists_every_key_under_its_group():
    from lab_utils.core.config import GROUPS, KEYS

    p = cli("keys")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    headers = [ln[2:] for ln in lines if ln.startswith("# ")]
    assert headers == list(GROUPS)  # every group, in config.py's order
    listed = [ln.split()[0] for ln in lines if ln and not ln.startswith((" ", "#", "keys for"))]
    assert listed == list(KEYS)  # every key once, in KEYS order (each group's keys follow its header)
    first_of_group = {ln[2:]: lines[i + 1].split()[0] for i, ln in enumerate(lines) if ln.startswith("# ")}
    assert first_of_group == GROUPS
    row = {ln.split()[0]: ln for ln in lines if ln and not ln.startswith((" ", "#"))}
    assert row["sampler"].split()[1:3] == ["str", "default"] and "distributed | global | random" in row["sampler"]
    assert "[0.0, 1.0)" in row["dropout"] and ">= 1" in row["steps"] and "or none (derived)" in row["grad_accum_steps"]
    assert KEYS["pg_timeout"].help in p.stdout


def test_run_help_points_to_keys():
    p = cli("run", "--help")
    assert p.returncode == 0 and "ddp-lab keys" in p.stdout


def test_demo_runs_end_to_end(runs_dir):
    """`make lab`'s demo, with 3 steps: four real runs, the parity table and the plot file."""
    import os

    p = subprocess.run([sys.executable, "-m", "lab_utils", "demo", "--steps", "3"], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "LAB_RUNS_DIR": str(runs_dir)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    table = p.stdout[p.stdout.index("comparison"):]
    assert "naive port" in table and "2 ranks vs emulated    3 (bitwise)" in table, table
    assert (runs_dir / "demo_parity.png").stat().st_size > 0
