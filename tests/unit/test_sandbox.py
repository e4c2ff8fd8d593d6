"""The sandbox's command line, policy and environment, and the executor's caps:
pure checks of what the executor would run, without running it."""

from __future__ import annotations

import dataclasses

import pytest

from cronwheel import config
from services.executor.main import SandboxSettings
from services.executor.sandbox import (
    BWRAP_PROCS,
    Cgroups,
    Limits,
    Policy,
    Sandbox,
    SandboxUnavailable,
    TargetRefused,
    Tools,
    build_argv,
    command_env,
)
from services.executor.service import Slots

TOOLS = Tools(
    bwrap="/usr/bin/bwrap", prlimit="/usr/bin/prlimit", setpriv="/usr/bin/setpriv", sh="/bin/sh"
)
FDS = {"passwd": 5, "group": 6, "payload": 7, "seccomp": 8, "resolv": 9, "hosts": 10}
LIMITS = Limits(
    memory_mb=256, cpu_ms=1500, pids=32, network=False, fsize_mb=8, nofile=64, scratch_mb=16
)


def argv(limits: Limits = LIMITS, **kw) -> list[str]:
    kw.setdefault("uid", 200_001)
    kw.setdefault("cgroup", None)
    return build_argv(TOOLS, ["sh", "-c", "echo hi"], limits, fds=FDS, **kw)


def options(args: list[str]) -> list[str]:
    """The sandbox's arguments: bwrap's, up to the command."""
    start = args.index(TOOLS.bwrap)
    return args[start : args.index("--", start)]


def before(opts: list[str], value: str, n: int) -> list[str]:
    """`value` and the `n` arguments before it."""
    i = opts.index(value)
    return opts[i - n : i + 1]


def test_argv__every_namespace_unshared__no_network__killed_with_its_parent():
    opts = options(argv())
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"):
        assert flag in opts
    assert "--share-net" not in opts
    assert before(opts, "8", 1) == ["--seccomp", "8"]  # the syscall allowlist
    assert argv()[-3:] == ["sh", "-c", "echo hi"]


def test_argv__network__only_when_the_limits_ask_for_it__in_the_runs_own_namespace():
    limits = Limits(**{**LIMITS.__dict__, "network": True})
    args = argv(limits, netns="/run/netns/cw-200001")
    assert args[:3] == ["nsenter", "--net=/run/netns/cw-200001", "--"]  # before the uid switch
    opts = options(args)
    assert "--share-net" in opts  # bwrap keeps the namespace nsenter joined
    assert before(opts, "/etc/resolv.conf", 2) == ["--ro-bind-data", "9", "/etc/resolv.conf"]
    with pytest.raises(ValueError, match="own network namespace"):
        argv(limits)  # never the executor's own network


def test_argv__host_paths__only_system_dirs_read_only__nothing_writable():
    opts = options(argv())
    assert "--bind" not in opts and "--dev-bind" not in opts  # no writable host path
    binds = [opts[i + 1] for i, o in enumerate(opts) if o in ("--ro-bind", "--ro-bind-try")]
    assert binds, "the OS's programs must be there"
    for path in binds:
        assert path.startswith(("/usr", "/bin", "/sbin", "/lib", "/etc/")), path
    joined = " ".join(opts)
    for private in ("/root", "/work", "/home", "/var", "/run/cronwheel-executor"):
        assert f" {private} " not in f" {joined} "
    assert before(opts, "/usr/local", 1) == ["--tmpfs", "/usr/local"]
    assert before(opts, "/scratch", 3) == ["--size", str(16 << 20), "--tmpfs", "/scratch"]


def test_argv__rlimits__cpu_rounded_up__nproc_counts_bwraps__memory_as_address_space():
    args = argv()
    assert args[:6] == [
        "/usr/bin/setpriv", "--reuid=200001", "--regid=200001", "--clear-groups",
        "--no-new-privs", "--",
    ]  # fmt: skip
    limits = args[args.index(TOOLS.prlimit) + 1 : args.index(TOOLS.bwrap)]
    assert "--cpu=2:3" in limits  # 1500 ms -> 2 s soft, SIGKILL a second later
    assert f"--as={256 << 20}" in limits
    assert f"--nproc={32 + BWRAP_PROCS}" in limits
    assert f"--fsize={8 << 20}" in limits and "--nofile=64" in limits and "--core=0" in limits


def test_argv__with_a_cgroup__joins_it_first__memory_left_to_the_cgroup(tmp_path):
    args = argv(cgroup=tmp_path / "run-1")
    assert args[:4] == [
        "/bin/sh",
        "-c",
        'echo $$ > "$0" && exec "$@"',
        str(tmp_path / "run-1" / "cgroup.procs"),
    ]
    assert not any(a.startswith("--as=") for a in args)


def test_argv__not_root__no_uid_switch_and_no_nproc():
    args = argv(uid=None, cgroup=None)
    assert args[0] == TOOLS.prlimit
    assert not any(a.startswith("--nproc") for a in args)


def test_policy__defaults_apply__ceilings_and_network_refused():
    policy = Policy(max_memory_mb=1024)
    got = policy.limits_for({"limits": {"memory_mb": 300}})
    assert (got.memory_mb, got.pids, got.cpu_ms, got.network) == (300, 64, 600_000, False)
    with pytest.raises(TargetRefused, match="limits.memory_mb"):
        policy.limits_for({"limits": {"memory_mb": 2048}})
    with pytest.raises(TargetRefused, match="CRONWHEEL_EXECUTOR_ALLOW_NETWORK"):
        policy.limits_for({"limits": {"network": True}})
    assert Policy(allow_network=True).limits_for({"limits": {"network": True}}).network


def policy_from(env: dict[str, str]) -> Policy:
    """The Policy `cronwheel serve executor` builds from `env`."""
    return Policy(**dataclasses.asdict(config.load(SandboxSettings, env)))


def test_policy__from_the_services_settings__reads_the_operator_settings():
    policy = policy_from({"CRONWHEEL_EXECUTOR_ALLOW_NETWORK": "1", "CRONWHEEL_EXECUTOR_PIDS": "16"})
    assert policy.allow_network and policy.pids == 16
    assert not policy_from({}).allow_network


def test_command_env__only_the_targets_variables_and_defaults(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://executor-secret")
    env = command_env({"MODE": "prod", "PATH": "/usr/bin"}, {"CRONWHEEL_RUN_ID": "r1"})
    assert env == {
        "MODE": "prod",
        "PATH": "/usr/bin",  # the target's own wins over the default
        "HOME": "/scratch",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "CRONWHEEL_RUN_ID": "r1",
    }


@pytest.mark.parametrize("name", ["CRONWHEEL_RUN_ID", "BAD=NAME", "1X", ""])
def test_command_env__reserved_or_malformed_names__refused(name):
    with pytest.raises(TargetRefused):
        command_env({name: "x"}, {})


def test_sandbox__without_bwrap__refuses_to_start(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="bubblewrap.*never execute unsandboxed"):
        Sandbox(Policy(), slots=1)


def test_cgroups__per_run_child__memory_and_pids_written(tmp_path):
    parent = tmp_path / "executor"
    parent.mkdir()
    path = Cgroups(parent).create("run-1", LIMITS)
    assert (path / "memory.max").read_text() == str(256 << 20)
    assert (path / "pids.max").read_text() == str(32 + BWRAP_PROCS)
    for f in ("memory.max", "pids.max"):
        (path / f).unlink()
    Cgroups(parent).remove(path)
    assert not path.exists()


def test_cgroups__configured_directory_without_controllers__refuses(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(SandboxUnavailable, match="CRONWHEEL_EXECUTOR_CGROUP"):
        Cgroups.find(str(tmp_path))


def test_cgroups__configured_directory__controllers_enabled_for_children(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    assert Cgroups.find(str(tmp_path)).parent == tmp_path
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+pids"


def test_slots__executor_and_tenant_caps():
    slots = Slots(total=3, per_tenant=2)
    assert slots.take("a") and slots.take("a")
    assert not slots.take("a")  # the tenant's cap
    assert slots.take("b")
    assert not slots.take("c")  # the executor's cap
    slots.give("a")
    assert slots.take("c") and slots.in_use() == 3
