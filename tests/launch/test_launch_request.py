"""LaunchRequest (lab_utils/launch/launch_request.py): options sorted into their groups, bad values named when the
request is made (before any launch), and launch / launch_many refusing what is not a request. Nothing is started."""
import dataclasses
import threading

import pytest

from lab_utils.core.config import ConfigError
from lab_utils.core.runfiles import TRAIN
from lab_utils.launch import launcher
from lab_utils.launch.launch_request import (
    OPTION_GROUP,
    Environment,
    LaunchRequest,
    Output,
    Supervision,
    Topology,
    request,
    requests_from_specs,
)


def test_request_sorts_options_into_their_groups():
    hold = threading.Event()
    r = request("x", 2, ["steps=1"], timeout=30, progress=False, stall_timeout=5, hold=hold, master_port=29500,
                extra_env={"A": "1"}, runner="torchrun")
    assert (r.name, r.nproc, r.overrides, r.timeout) == ("x", 2, ["steps=1"], 30)
    assert r.topology == Topology(master_port=29500)
    assert r.supervision.stall_timeout == 5 and r.supervision.hold is hold  # the caller's own Event, not a copy
    assert r.environment == Environment(runner="torchrun", extra_env={"A": "1"}, script=TRAIN)
    assert r.output == Output(progress=False, echo=False)
    assert request("x") == LaunchRequest("x")  # the defaults are launch()'s of old
    assert set(OPTION_GROUP) == {"nnodes", "hosts", "endpoints", "rdzv_conf", "master_port", "stall_timeout",
                                 "peer_grace", "hold", "script", "runner", "extra_env", "runs_dir", "max_restarts",
                                 "progress", "echo"}


def test_an_unknown_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="stall_timout"):
        request("x", 1, stall_timout=5)


@pytest.mark.parametrize("make, fragment", [
    (lambda: request("x", 1, runner="mpirun"), "runner='mpirun' must be 'driver' or 'torchrun'"),
    (lambda: request("x", 1, peer_grace=-1), "peer_grace=-1 must be >= 0"),
    (lambda: request("x", 1, stall_timeout=0), "stall_timeout=0 must be > 0"),
    (lambda: request("x", 1, nnodes=2, master_port=29500), "master_port=29500: one node only"),
    (lambda: request("x", 1, master_port=70000), "master_port=70000"),
    (lambda: request("x", 1, endpoints=[None]), "hosts= and endpoints= are for nnodes >= 2"),
    (lambda: request("x", 1, nnodes=2, endpoints=["127.0.0.1:1"]), "one HOST:PORT"),
    (lambda: request("x", 1, nnodes=2, rdzv_conf={"join_timeout": "1,is_host=1"}), "rdzv_conf="),
    (lambda: request("x", 0), "nproc=0 must be a positive integer"),
    (lambda: request("x", 1, nnodes=0), "nnodes=0 must be a positive integer"),
    (lambda: request("a b", 1), "--name 'a b'"),
    (lambda: request("x", 1, timeout=0), "timeout=0 must be > 0"),
    (lambda: LaunchRequest("x", supervision=Supervision(stall_timeout=-1)), "stall_timeout=-1"),
])
def test_a_bad_value_is_named_when_the_request_is_made(make, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("*", r"\*")):
        make()


def test_replace_checks_again():
    with pytest.raises(ConfigError, match="nproc=-1"):
        dataclasses.replace(request("x", 2), nproc=-1)


def test_quiet_turns_off_the_bar_only():
    r = request("x", 2, echo=True)
    assert r.quiet().output == Output(progress=False, echo=True) and r.output.progress  # r itself unchanged


def test_requests_from_specs_lets_a_specs_own_options_win():
    got = requests_from_specs({"a": ("ra", 1, ["steps=1"]), "b": ("rb", 2, {"steps": 2}, {"timeout": 8})},
                              timeout=300, runs_dir="/tmp/r")
    assert list(got) == ["a", "b"]
    assert (got["a"].name, got["a"].timeout, got["b"].timeout) == ("ra", 300, 8)
    assert got["b"].environment.runs_dir == "/tmp/r" and got["b"].overrides == {"steps": 2}


def test_launch_and_launch_many_take_requests_only(runs_dir):
    with pytest.raises(TypeError, match="launch\\(\\) takes a LaunchRequest"):
        launcher.launch("x")  # a name alone, as the keyword form began
    with pytest.raises(TypeError, match="'a' is a tuple, not a LaunchRequest"):
        launcher.launch_many({"a": ("x", 1, ["steps=1"])}, max_workers=1)
    assert not runs_dir.exists()
