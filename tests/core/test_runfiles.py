"""The run-folder contract: the parameter fingerprint and the heartbeat phases."""

import pytest
import torch

from lab_utils.core import runfiles


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_fingerprint_is_deterministic_and_sees_one_flipped_bit():
    m = _model()
    h = runfiles.fingerprint(m)
    assert h == runfiles.fingerprint(_model()) and len(h) == 16
    for name, p in m.named_parameters():  # every parameter, first and last element, lowest bit
        for index in (0, p.numel() - 1):
            with torch.no_grad():
                p.view(-1).view(torch.int32)[index] ^= 1
            assert runfiles.fingerprint(m) != h, f"{name}[{index}]: a flipped bit went unseen"
            with torch.no_grad():
                p.view(-1).view(torch.int32)[index] ^= 1
    assert runfiles.fingerprint(m) == h


def test_fingerprint_sees_swapped_values_and_structure():
    m = _model()
    h = runfiles.fingerprint(m)
    with torch.no_grad():  # same multiset of bits, other positions: a plain sum would not see it
        w = m[0].weight.view(-1)
        w[0], w[1] = w[1].clone(), w[0].clone()
    assert runfiles.fingerprint(m) != h
    assert runfiles.fingerprint(torch.nn.Sequential(torch.nn.Linear(8, 16))) != \
        runfiles.fingerprint(torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(8, 16)))


def test_heartbeat_rejects_a_phase_the_launcher_does_not_know(tmp_path):
    beat = runfiles.Heartbeat(tmp_path, 0)
    beat.beat(step=0, phase="forward/backward")
    assert runfiles.read_heartbeats(tmp_path)[0]["phase"] == "forward/backward"
    with pytest.raises(ValueError, match="PHASES"):
        beat.beat(phase="somewhere new")


def test_step_beats_off_skips_only_the_in_step_writes(tmp_path):
    """bench scaling's "lab overhead off" rows time the step without the 4 heartbeat writes a step; the beats
    that carry results (hashes, running stats) and setup/finished must still reach the file."""
    beat = runfiles.Heartbeat(tmp_path, 0, step_beats=False)
    beat.beat(step=-1, phase="setup")
    for phase in runfiles.STEP_PHASES:
        beat.beat(step=3, phase=phase)
        assert runfiles.read_heartbeats(tmp_path)[0]["phase"] == "setup"
    beat.beat(buffer_hash="abc")
    assert runfiles.read_heartbeats(tmp_path)[0]["buffer_hash"] == "abc"
    beat.beat(phase="finished")
    assert runfiles.read_heartbeats(tmp_path)[0]["phase"] == "finished"


def test_synced_span_times_only_records_taken_after_a_host_sync(tmp_path):
    """Benchmarks time the steps between two records taken right after StepLog's copy (the only host sync):
    with log_sync_every=10 those are steps 10, 20, ...; another record's clock can run ahead of the GPU."""
    import json

    from lab_utils.core.runfiles import synced_span

    (tmp_path / "config.json").write_text(json.dumps({"config": {"log_sync_every": 10}}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "elapsed": s}) + "\n" for s in range(35)))
    first, last = synced_span(tmp_path, warmup=5)
    assert (first["step"], last["step"]) == (10, 30)
    with pytest.raises(ValueError, match="fewer than 2 synced records"):
        synced_span(tmp_path, warmup=25)
