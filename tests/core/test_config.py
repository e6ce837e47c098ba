import pytest

from lab_utils.core.config import ConfigError, parse_overrides, resolve


def test_defaults_derive_micro_batch_from_world_size():
    one, two = resolve([], 1), resolve([], 2)
    assert (one["micro_batch_size"], one["grad_accum_steps"]) == (16, 1)
    assert (two["micro_batch_size"], two["grad_accum_steps"]) == (8, 1)


def test_same_keys_describe_single_and_ddp_run():
    keys = ["global_batch_size=32", "micro_batch_size=4"]
    assert resolve(keys, 1)["grad_accum_steps"] == 8
    assert resolve(keys, 2)["grad_accum_steps"] == 4  # §3.3: the accumulation is divided, the global batch kept
    keys = ["global_batch_size=32", "grad_accum_steps=2"]
    assert resolve(keys, 2)["micro_batch_size"] == 8


def test_emulate_ranks_lays_out_like_world_size():
    cfg = resolve(["emulate_ranks=2"], 1)
    assert cfg["micro_batch_size"] == 8


@pytest.mark.parametrize("items, fragment", [
    (["stepz=3"], "unknown key 'stepz' (did you mean steps?)"),
    (["steps=-1"], "steps=-1 must be >= 1"),
    (["steps=abc"], "steps='abc' is not an integer"),
    (["steps=2.5"], "steps='2.5' is not an integer"),
    (["sampler=magic"], "sampler='magic' is not one of: distributed, global, random"),
    (["global_batch_size=15"], "global_batch_size=15 is not divisible by grad_accum_steps*world_size=1*2"),
    (["global_batch_size=16", "micro_batch_size=3"], "global_batch_size=16 is not divisible by micro_batch_size"),
    (["global_batch_size=16", "micro_batch_size=4", "grad_accum_steps=4"], "global_batch_size=16 != micro_batch"),
    (["lr=nan"], "lr='nan' must be finite"),
    (["dropout=1"], "dropout=1.0 must be < 1.0"),
    (["no_sync=maybe"], "no_sync='maybe' is not a boolean"),
    (["steps"], "'steps': expected key=value"),
    (["emulate_ranks=2"], "emulate_ranks=2 only makes sense with one process"),
    (["augment=keyed"], "augment='keyed' needs model=bn_net"),
    (["fault=crash", "fault_rank=5"], "fault_rank=5 but world_size is 2"),
])
def test_bad_input_names_the_key(items, fragment):
    with pytest.raises(ConfigError) as e:
        resolve(items, 2)
    assert fragment in str(e.value)


def test_world_size_must_be_positive():
    with pytest.raises(ConfigError, match="world_size=0"):
        resolve([], 0)


def test_parse_accepts_python_values():
    assert parse_overrides({"steps": 3, "no_sync": False, "lr": 1e-3}) == {"steps": 3, "no_sync": False, "lr": 1e-3}


def test_none_is_a_value_where_it_is_a_choice():
    cfg = resolve(["model=bn_net", "norm=none", "augment=none", "fault=none", "amp=none"], 1)
    assert (cfg["norm"], cfg["augment"], cfg["fault"], cfg["amp"]) == ("none", "none", "none", "none")
    assert resolve(["micro_batch_size=none"], 2)["micro_batch_size"] == 8  # optional keys: none = derive it


def test_workshop_preset_yields_to_explicit_keys():
    cfg = resolve(["preset=workshop", "n_layer=2"], 2)
    assert (cfg["n_layer"], cfg["n_embd"], cfg["global_batch_size"]) == (2, 512, 256)


def test_fsdp2_ranks_sharing_a_gpu_over_gloo_are_refused_by_name():
    """FSDP2 over gloo on CUDA tensors crashed every rank with SIGSEGV on one H200 (torch 2.11): the lab refuses
    it before launch, naming the way out. torch.device("cuda") needs no GPU to exist, so this runs on CPU."""
    import torch

    from lab_utils.core import distenv

    cuda = torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"wrap=fsdp2 with 2 ranks sharing .* pass device=cpu"):
        distenv.check_sharded_device({"wrap": "fsdp2"}, cuda, "gloo", 2)
    distenv.check_sharded_device({"wrap": "ddp"}, cuda, "gloo", 2)  # DDP over gloo on a shared GPU works
    distenv.check_sharded_device({"wrap": "fsdp2"}, cuda, "nccl", 2)  # one GPU per rank
    distenv.check_sharded_device({"wrap": "fsdp2"}, torch.device("cpu"), "gloo", 2)
    assert distenv.sharded_run_device(4) == ("cpu" if 0 < torch.cuda.device_count() < 4 else "auto")
