"""checkpoint_format=sharded without launching anything (the real 2- and 4-rank runs are in test_fsdp2.py's
`sharded` fixture): the keys it is refused with, before launch and naming the key; which folder a resume
takes when a write was cut short; what a resume from one rank's shards is told."""

import pytest
import torch

from lab_utils.core import checkpoint, resume, sharded_checkpoint
from lab_utils.core import config as config_mod

SHARDED = {"wrap": "fsdp2", "checkpoint_format": "sharded", "checkpoint_every": 2}


@pytest.mark.parametrize("keys, world, named", [
    ({**SHARDED, "wrap": "ddp"}, 2, "checkpoint_format=sharded with wrap=ddp"),
    (SHARDED, 1, "checkpoint_format=sharded needs 2\\+ ranks"),
    ({**SHARDED, "checkpoint_style": "article"}, 2, "checkpoint_format=sharded with checkpoint_style=article"),
    ({**SHARDED, "checkpoint_write": "naive"}, 2, "checkpoint_format=sharded with checkpoint_write=naive"),
    ({**SHARDED, "fault": "kill_in_save", "fault_step": 1}, 2, "checkpoint_format=sharded with fault=kill_in_save"),
    ({"wrap": "fsdp2", "fsdp2_bug": "rank0_saves_sharded"}, 2, "fsdp2_bug=rank0_saves_sharded is a bug of the "),
    ({"fsdp2_bug": "rank0_saves_sharded", "checkpoint_format": "sharded", "checkpoint_every": 2}, 2,
     "checkpoint_format=sharded with wrap=ddp"),
    ({"checkpoint_format": "dcp"}, 2, "checkpoint_format='dcp' is not one of: full, sharded"),
])
def test_sharded_checkpoints_are_refused_where_not_built(keys, world, named):
    with pytest.raises(config_mod.ConfigError, match=named):
        config_mod.resolve(keys, world)


def _fake_dcp(path):
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    torch.save({"step": 0}, path / sharded_checkpoint.META)
    return path


def test_a_sharded_checkpoint_resumes_only_a_sharded_run(tmp_path):
    folder = _fake_dcp(tmp_path / "step_000004")
    config_mod.resolve({**SHARDED, "resume": str(folder)}, 2)  # accepted
    for keys, world in (({"resume": str(folder)}, 2), ({**SHARDED, "checkpoint_format": "full",
                                                        "resume": str(folder)}, 1)):
        with pytest.raises(config_mod.ConfigError, match="dcp_to_torch"):  # told how to convert it
            config_mod.resolve(keys, world)


def test_resume_takes_the_newest_complete_checkpoint_of_either_format(tmp_path):
    """A sharded write cut short leaves step_N.tmp/ (or a folder without DCP's .metadata, written last): both
    are skipped, so the newest complete checkpoint is the one before."""
    ckpts = tmp_path / checkpoint.CHECKPOINTS
    _fake_dcp(ckpts / "step_000004")
    (ckpts / "step_000002.pt").write_bytes(b"x")
    assert resume.newest(tmp_path) == ckpts / "step_000004"
    _fake_dcp(ckpts / "step_000008.tmp")
    (ckpts / "step_000006").mkdir()  # the shards but no .metadata
    (ckpts / "step_000006" / "__0_0.distcp").write_bytes(b"x")
    assert resume.newest(tmp_path) == ckpts / "step_000004"
    assert resume.find(str(ckpts / "step_000004"), tmp_path) == ckpts / "step_000004"  # a folder that IS one
    assert resume.find(str(tmp_path), tmp_path) == ckpts / "step_000004"  # a run folder: its newest


def test_one_ranks_shards_are_named_as_such():
    model = torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.LayerNorm(7))
    checkpoint.check_model_shapes(model, model.state_dict(), "ok.pt")
    for world in (2, 4):
        rank0 = {k: v.chunk(world)[0] for k, v in model.state_dict().items()}  # fully_shard's dim-0 chunks
        with pytest.raises(RuntimeError, match=f"what rank 0 of {world} FSDP2 ranks holds.*rank0_saves_sharded"):
            checkpoint.check_model_shapes(model, rank0, "bad.pt")
    other = dict(model.state_dict(), **{"0.weight": torch.zeros(3, 4)})  # another model, not a shard
    with pytest.raises(RuntimeError, match=r"1 of 4 tensors .*0.weight is \(3, 4\)") as e:
        checkpoint.check_model_shapes(model, other, "other.pt")
    assert "FSDP2" not in str(e.value)
