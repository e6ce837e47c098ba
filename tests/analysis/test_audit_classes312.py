"""Issue 35: classes of round 312-317's first look (docs/measured/cpu2/audit_heldout_round312.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (ed18b8a)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules

LOOP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP


def test_a_seed_the_distributed_switch_replaces_with_the_rank(tmp_path):
    """TorchSeg: `seed = config.seed`, then `if engine.distributed: seed = engine.local_rank`, then
    torch.manual_seed(seed): rank 0 seeds 0 where the single run seeds config.seed (seed-per-rank). Adding the
    rank to the configured seed keeps rank 0's seed the single run's."""
    train = HEAD + ("import argparse\nparser = argparse.ArgumentParser()\n"
                    "parser.add_argument('--local_rank', type=int, default=0)\nargs = parser.parse_args()\n"
                    "distributed = dist.is_available() and dist.is_torchelastic_launched()\nbase_seed = 12345\n"
                    "seed = base_seed\n"
                    "if distributed:\n    dist.init_process_group('gloo')\n    seed = SEED\ntorch.manual_seed(seed)\n"
                    "model = torch.nn.Linear(2, 2)\nif distributed:\n    model = DDP(model)\n" + LOOP)
    replaced = train.replace("SEED", "args.local_rank")
    hits = _rules(_project(tmp_path / "replaced", {"train.py": replaced}), "seed-per-rank")
    assert [h.line for h in hits] == [_line(replaced, "torch.manual_seed(seed)")]
    added = train.replace("SEED", "base_seed + args.local_rank")
    assert not _rules(_project(tmp_path / "added", {"train.py": added}), "seed-per-rank")


def test_a_rendezvous_formatted_from_a_fixed_port_option(tmp_path):
    """CASS-NAT: `init_method='tcp://{}:{}'.format(args.master_addr, args.port)` with `--port` defaulting to a
    number and no MASTER_PORT fallback: a fixed port on this host (hard-coded-master-port). Taking the port from
    the environment, the option's default, leaves it open."""
    train = SEED_ONLY + ("import argparse, os\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--port', DEFAULT)\nparser.add_argument('--master_addr', "
                         "default='localhost')\nargs = parser.parse_args()\n"
                         "dist.init_process_group('gloo', init_method='tcp://{}:{}'.format(args.master_addr, "
                         "args.port), world_size=1, rank=0)\nmodel = DDP(torch.nn.Linear(2, 2))\n" + LOOP)
    fixed = train.replace("DEFAULT", "type=int, default=1001")
    hits = _rules(_project(tmp_path / "fixed", {"train.py": fixed}), "hard-coded-master-port")
    assert [h.line for h in hits] == [_line(fixed, "init_method='tcp://{}:{}'")]
    env = train.replace("DEFAULT", "default=os.environ.get('MASTER_PORT', '29500')")
    assert not _rules(_project(tmp_path / "env", {"train.py": env}), "hard-coded-master-port")


def test_minkowski_batchnorm_built_by_a_base_class(tmp_path):
    """DSPv2: the policy's encoder is `ResNet14(...)`, a subclass of no methods of its own whose base's __init__
    builds `get_norm(...)`, a helper returning `ME.MinkowskiBatchNorm(...)`: the wrapped model has BatchNorm
    (batchnorm-without-sync). With an instance norm there nothing normalises over the batch."""
    common = ("import MinkowskiEngine as ME\ndef get_norm(n_channels):\n    return ME.NORM(n_channels)\n")
    resnet = ("import torch\nfrom common import get_norm\nclass ResNetBase(torch.nn.Module):\n    LAYERS = (1, 1)\n"
              "    def __init__(self, in_channels):\n        super().__init__()\n"
              "        self.bn1 = get_norm(in_channels)\n"
              "class ResNet14(ResNetBase):\n    LAYERS = (1, 1, 1, 1)\n")
    policy = ("import torch\nfrom resnet import ResNet14\nclass Policy(torch.nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n        self.encoder = ResNet14(3)\n")
    train = SEED_ONLY + ("from policy import Policy\ndist.init_process_group('gloo')\npolicy = Policy()\n"
                         "model = DDP(policy)\n" + LOOP)
    files = {"train.py": train, "policy.py": policy, "resnet.py": resnet}
    hits = _rules(_project(tmp_path / "bn", {**files, "common.py": common.replace("NORM", "MinkowskiBatchNorm")}),
                  "batchnorm-without-sync")
    assert [h.line for h in hits] == [_line(train, "model = DDP(")]
    instance = {**files, "common.py": common.replace("NORM", "MinkowskiInstanceNorm")}
    assert not _rules(_project(tmp_path / "instance", instance), "batchnorm-without-sync")
