"""What a managed run's command cannot do, through the real pipeline (job ->
relay -> dispatcher -> executor -> bwrap -> CompleteRun): the seccomp
allowlist bwrap applies (services/executor/seccomp_filter.py), and where a
run with `network: true` may connect (services/executor/egress.py).

The executor here allows network, so it installs the host's egress rules;
one address range is allowed by the operator setting, and a test server in a
network namespace of its own answers there (and, at a second address, outside
the allowed range), which shows that the network is on and the rules decide."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from services.executor import seccomp_filter
from services.executor.egress import TABLE, find_tool
from services.executor.sandbox import Policy, Sandbox, TargetRefused
from tests.integration.test_executor import Platform, serving
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: make system-deps"),
]
# In CI (CI=true, root, make system-deps installed nftables) these run: a
# missing nft there is a failure, not a skip.
needs_egress = pytest.mark.skipif(
    os.geteuid() != 0 or (find_tool("nft") is None and os.environ.get("CI") != "true"),
    reason="the egress rules need root and nft (make system-deps)",
)

# The test server's namespace: reached through the host at ALLOWED (inside the
# operator's allowed CIDR) and at NOT_ALLOWED (a private address outside it).
SERVER_NET = ipaddress.IPv4Network("10.253.7.0/30")
HOST_END, ALLOWED = "10.253.7.1", "10.253.7.2"
NOT_ALLOWED = "10.253.9.2"
EGRESS_SUBNET = "10.252.0.0/16"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def test_server():
    """An HTTP server in a network namespace of its own, whose veth's host end is
    not a run's (`cwt...`, not `cwh...`); yields the port it serves on."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root")
    tag = uuid.uuid4().hex[:6]
    ns, host_if = f"cwtest-{tag}", f"cwt{tag}"
    _ip("netns", "add", ns)
    server = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{HOST_END}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("route", "add", f"{NOT_ALLOWED}/32", "dev", host_if)
        for args in (
            ("addr", "add", f"{ALLOWED}/30", "dev", "eth0"),
            ("addr", "add", f"{NOT_ALLOWED}/32", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", HOST_END),
        ):
            _ip("-n", ns, *args)
        port = 18000 + int(tag, 16) % 1000
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(port),
             "--bind", "0.0.0.0", "--directory", "/usr/share/doc"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def answers() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((ALLOWED, port), 1):
                return True
            return False

        wait_for(answers, 15, what="the test server to listen")  # from the host: routed
        yield port
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


@pytest.fixture(scope="module")
def platform(servers, db_template, new_topic_prefix, test_server):
    policy = Policy(allow_network=True, egress_allow=(SERVER_NET,), egress_subnet=EGRESS_SUBNET)
    with serving(
        servers, db_template, new_topic_prefix, policy=policy, concurrency=2, per_tenant=2
    ) as p:
        yield p


def run_python(platform: Platform, script: str, **job) -> dict:
    tenant = platform.tenant()
    run_id = platform.trigger(tenant, ["python3", "-c", script], **job)
    return platform.finished(tenant, run_id)


# -- seccomp ------------------------------------------------------------------------

DENIED_CALLS = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def attempt(what, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print(what, "->", "allowed" if r != -1 else f"{errno.errorcode[e]} ({os.strerror(e)})")
# These three succeed for an unprivileged process without the filter:
attempt("personality(ADDR_NO_RANDOMIZE)", 135, 0x0040000)
attempt("ptrace(PTRACE_TRACEME)", 101, 0, 0, 0, 0)
attempt("add_key", 248, ctypes.addressof(ctypes.create_string_buffer(b"user")),
        ctypes.addressof(ctypes.create_string_buffer(b"k")),
        ctypes.addressof(ctypes.create_string_buffer(b"v")), 1, -2)
attempt("keyctl", 250, 0, 0)
attempt("bpf", 321, 0, 0, 0)
attempt("perf_event_open", 298, 0, 0, -1, -1, 0)
attempt("userfaultfd", 323, 1)
attempt("unshare(CLONE_NEWUSER)", 272, 0x10000000)
attempt("setns", 308, 0, 0)
attempt("clone(CLONE_NEWNET)", 56, 0x40000000 | 17, 0, 0, 0, 0)
attempt("mount", 165, 0, 0, 0, 0, 0)
attempt("open_by_handle_at", 304, 0, 0, 0)
sys.exit(3)
"""


def test_seccomp__denied_syscalls__eperm__the_run_fails_with_each_named(platform):
    run = run_python(platform, DENIED_CALLS)
    assert run["state"] == "FAILED" and run["error"] == "exit code 3"
    lines = run["result"]["output"].splitlines()
    assert len(lines) == 12, lines
    for line in lines:
        assert line.endswith("-> EPERM (Operation not permitted)"), line


def test_seccomp__clone3__enosys__so_threads_and_processes_fall_back_to_clone(platform):
    script = (
        "import ctypes, errno, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.syscall(435, 0, 0)\n"
        "print('clone3', errno.errorcode[ctypes.get_errno()])\n"
        "t = threading.Thread(target=print, args=('thread ran',)); t.start(); t.join()\n"
        "print(subprocess.run(['echo', 'child ran'], capture_output=True, text=True).stdout)\n"
    )
    run = run_python(platform, script)
    assert run["state"] == "SUCCEEDED", run["result"]
    out = run["result"]["output"]
    assert "clone3 ENOSYS" in out and "thread ran" in out and "child ran" in out


def test_seccomp__a_syscall_of_another_architecture__kills_the_process(platform):
    # i386's getpid through int 0x80 from an x86_64 process: not the filter's arch.
    script = (
        "import ctypes, mmap\n"
        "code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "code.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')  # mov eax,20; int 0x80; ret\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))\n"
        "print('before', flush=True)\n"
        "print('i386 getpid returned', f(), flush=True)\n"
    )
    run = run_python(platform, script)
    assert run["state"] == "FAILED"
    assert run["result"]["exit_code"] == 128 + 31, run["result"]  # SIGSYS
    assert run["result"]["output"] == "before\n"


def test_seccomp__ordinary_programs__run(platform):
    tenant = platform.tenant()
    script = (
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status;"
        " seq 1 1000 | sort -rn | head -1; echo abc | sha256sum | cut -c1-8;"
        " mkdir -p d/e && cp /etc/group d/e/ && ls -R d | wc -l; date -u +%Y >/dev/null;"
        " (sleep 0.1 & wait) && echo background ok;"
        " /sbin/ldconfig -p | tail -1 | cut -d' ' -f1-3;"  # a static binary
        " python3 -c 'import asyncio, multiprocessing as m, sqlite3, ssl, socket;"
        " asyncio.run(asyncio.sleep(0)); print(m.Pool(2).map(abs, [-1, -2]),"
        ' sqlite3.connect(":memory:").execute("select 7").fetchone())\''
    )
    run_id = platform.trigger(tenant, ["sh", "-c", script])
    run = platform.finished(tenant, run_id)
    assert run["state"] == "SUCCEEDED", run["result"]
    out = run["result"]["output"]
    assert "Seccomp:\t2\n" in out  # filter mode
    assert "1000\n" in out and "edeaaff3\n" in out and "background ok\n" in out
    assert "Cache generated by:" in out
    assert "[1, 2] (7,)" in out


def test_seccomp__filter_lists__denied_names_never_allowed():
    assert not set(seccomp_filter.DENIED) & set(seccomp_filter.ALLOWED)
    assert {"clone", "clone3", "personality", "socket"}.isdisjoint(seccomp_filter.ALLOWED)


# -- egress ---------------------------------------------------------------------------

CONNECT = r"""
import socket, struct
def gateway():  # the host's end of this run's veth
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
for host, port in {targets!r}:
    host = gateway() if host == "gateway" else host
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(f"{{host}}:{{port}} connected", flush=True)
    except OSError as e:
        print(f"{{host}}:{{port}} {{type(e).__name__}} {{e.errno}} {{e}}", flush=True)
"""


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses other than loopback."""
    got = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    addrs = [line.split()[3].split("/")[0] for line in got.splitlines()]
    return [a for a in addrs if not a.startswith("127.")]


@needs_egress
def test_egress__stack_ports_metadata_and_private_addresses__unreachable(
    platform, servers, test_server
):
    pg = urlsplit(platform.database_url).port
    kafka = int(servers.kafka_bootstrap.rsplit(":", 1)[1])
    controller = 29093
    # A listener on every host address, to show the host's own addresses are
    # refused even where something listens there (the stack itself binds
    # loopback, which a run's namespace has its own of).
    listener = socket.create_server(("0.0.0.0", 0))
    open_port = listener.getsockname()[1]
    own = [a for a in host_addresses() if not a.startswith(("10.252.", "10.253."))]
    with contextlib.closing(listener):
        for addr in own:  # the host itself reaches the listener there
            socket.create_connection((addr, open_port), timeout=3).close()
        targets = [("127.0.0.1", pg), ("127.0.0.1", kafka), ("127.0.0.1", controller)]
        targets += [(a, p) for a in own for p in (pg, kafka, controller, open_port)]
        targets += [("gateway", p) for p in (pg, kafka, open_port)]
        targets += [("169.254.169.254", 80), ("10.0.0.1", 80), (NOT_ALLOWED, test_server)]
        run = run_python(
            platform, CONNECT.format(targets=targets), limits={"network": True}, timeout_ms=60_000
        )
    assert run["state"] == "SUCCEEDED", run["result"]
    lines = run["result"]["output"].splitlines()
    assert len(lines) == len(targets), lines
    for (host, port), line in zip(targets, lines, strict=True):
        outcome = line.split(" ", 1)[1]
        assert "connected" not in outcome, (host, port, outcome)
        if host == "127.0.0.1":  # the run's own loopback: nothing listens there
            assert outcome.startswith("ConnectionRefusedError 111"), (host, port, outcome)
        else:  # refused by the rules: ICMP administratively prohibited
            assert outcome.startswith("OSError 113"), (host, port, outcome)  # EHOSTUNREACH


@needs_egress
def test_egress__an_address_the_operator_allowed__reachable(platform, test_server):
    script = (
        "import urllib.request\n"
        f"body = urllib.request.urlopen('http://{ALLOWED}:{test_server}/', timeout=5).read()\n"
        "print('status ok', len(body) > 0)\n"
        "print(open('/etc/resolv.conf').read())\n"
    )
    run = run_python(platform, script, limits={"network": True})
    assert run["state"] == "SUCCEEDED", run["result"]
    assert "status ok True" in run["result"]["output"]
    egress = platform.executor.sandbox.egress
    assert egress is not None
    for server in egress.dns:
        assert f"nameserver {server}\n" in run["result"]["output"]


@needs_egress
def test_egress__rules_installed_while_running__namespaces_gone_after_each_run(platform):
    listed = subprocess.run(
        [find_tool("nft"), "list", "table", "inet", TABLE],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "10.253.7.0/30" in listed and "169.254.0.0/16" in listed
    run = run_python(platform, "print('hello')", limits={"network": True})
    assert run["state"] == "SUCCEEDED"
    wait_for(
        lambda: not [p for p in Path("/run/netns").glob("cw-*")],
        10,
        what="the run's network namespace removed",
    )


def test_no_network__the_command_has_only_its_own_loopback(platform):
    script = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    run = run_python(platform, script)
    assert run["state"] == "SUCCEEDED"
    assert run["result"]["output"] == "['lo']\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: refused for that reason instead")
def test_network_allowed__but_no_nft__network_runs_refused_with_the_reason__others_run(
    monkeypatch,
):
    which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, **kw: None if name == "nft" else which(name, **kw)
    )
    sandbox = Sandbox(Policy(allow_network=True), slots=1)  # its start-up probe ran `true`
    try:
        assert sandbox.egress is None
        assert sandbox.network.startswith("refused (")
        with pytest.raises(TargetRefused, match="cannot enforce its egress policy: .*nft"):
            sandbox.limits_for({"limits": {"network": True}})
        assert not sandbox.limits_for({"limits": {"network": False}}).network
    finally:
        sandbox.close()
