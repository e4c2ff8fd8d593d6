"""Where a managed run with `network: true` may connect: its own network
namespace, a veth pair to the host, NAT, and nftables rules on the host side.

Each such run gets a network namespace of its own (`cw-<uid>`, named for the
host uid the run owns, so concurrent runs and executors never share one): a
veth pair whose host end is `cwh<uid>`, a /31 from `egress_subnet` (the run's
index among the sandbox uids picks it), and a default route through the host.
The command joins that namespace (`nsenter --net`, before the uid switch) and
bwrap keeps it (`--share-net`); in it the command has no capability, so it
cannot change its addresses or routes. Leaving it, every packet crosses the
host's `inet cronwheel_egress` table (`ruleset`):

- input: nothing from a run reaches the host itself: not its loopback (the
  run's 127.0.0.1 is its own namespace's), not any of the host's own
  addresses, whatever listens there (the stack's PostgreSQL and Kafka, the
  gateway, metrics, SSH), and whatever the allow list says;
- forward: no IPv6 at all; nothing to another run's namespace; DNS (port 53)
  to the resolvers the runs are given; the operator's allowed CIDRs; nothing
  to a range core/ssrf.py forbids for webhooks (FORBIDDEN_V4: private,
  loopback, link-local and metadata, CGNAT, documentation, multicast,
  reserved); everything else (public addresses) is accepted and masqueraded
  behind the host's address. Nothing may open a connection into a run's
  namespace. Refusals are ICMP "administratively prohibited": a connect fails
  at once with EHOSTUNREACH rather than hanging.

Why a namespace and NAT rather than an egress proxy: the kernel applies the
rules to every packet whatever the program (a proxy only covers programs that
honour HTTP_PROXY, and only HTTP), DNS included, and there is no userspace
relay to keep up. The cost: the executor must be root (or hold CAP_NET_ADMIN
and CAP_SYS_ADMIN) and the host needs nftables and IPv4 forwarding, which the
executor turns on. Without these, runs that ask for network are refused (see
`Egress.start`), and the rest run as before.

Set-up is idempotent (the table is replaced whole, atomically, by `nft -f`),
shared by every executor on the host (each holds `egress.lock` shared), and
torn down by the last one to stop: it deletes the table and turns forwarding
back off if an executor turned it on.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cronwheel.core.ssrf import FORBIDDEN_V4

TABLE = "cronwheel_egress"
HOST_IF = "cwh"  # host ends of the runs' veths: cwh<uid>; the rules match "cwh*"
NETNS_DIR = Path("/run/netns")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
DNS_PORT = 53
IPv4Network = ipaddress.IPv4Network


# Where Debian puts nft and ip: a service started with a PATH that lacks the
# sbin directories (a non-login shell, a CI job) still finds them.
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


def find_tool(name: str) -> str | None:
    """`name`'s path on PATH, else in the system's sbin and bin directories."""
    return shutil.which(name) or shutil.which(name, path=SBIN_PATH)


class EgressUnavailable(RuntimeError):
    """This executor cannot enforce the egress policy: runs asking for network
    are refused with this reason."""


def netns_name(uid: int) -> str:
    return f"cw-{uid}"


def host_resolvers(resolv_conf: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """The host's IPv4 name servers a run can reach: not loopback ones (a run's
    loopback is its own), e.g. systemd-resolved's 127.0.0.53."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path(resolv_conf).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    addr = ipaddress.ip_address(parts[1])
                    if addr.version == 4 and not addr.is_loopback and str(addr) not in found:
                        found.append(str(addr))
    return tuple(found)


def ruleset(
    subnet: IPv4Network,
    allow: Sequence[IPv4Network],
    dns: Sequence[str],
    forbidden: Sequence[IPv4Network] = FORBIDDEN_V4,
) -> str:
    """The whole table, replaced atomically by `nft -f -` (an `add` first, so
    the `delete` finds it on a host where it does not exist yet)."""

    def elements(items: Sequence[object]) -> str:
        return f"elements = {{ {', '.join(str(i) for i in items)} }}" if items else ""

    runs = f'iifname "{HOST_IF}*"'
    refuse = "reject with icmpx type admin-prohibited"
    return f"""\
add table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
  set forbidden {{ type ipv4_addr; flags interval; auto-merge; {elements(forbidden)} }}
  set allowed {{ type ipv4_addr; flags interval; auto-merge; {elements(allow)} }}
  set resolvers {{ type ipv4_addr; {elements(dns)} }}
  chain input {{
    type filter hook input priority filter; policy accept;
    {runs} {refuse}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    {runs} meta nfproto ipv6 {refuse}
    {runs} oifname "{HOST_IF}*" {refuse}
    {runs} ip daddr @resolvers meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept
    {runs} ip daddr @allowed accept
    {runs} ip daddr @forbidden {refuse}
    {runs} accept
    oifname "{HOST_IF}*" ct state established,related accept
    oifname "{HOST_IF}*" drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {subnet} oifname != "{HOST_IF}*" masquerade
  }}
}}
"""


class Egress:
    """The host's side of the policy (`start`, `close`) and each run's
    namespace (`open`, `release`)."""

    def __init__(
        self,
        *,
        ip: str,
        nft: str,
        nsenter: str,
        subnet: IPv4Network,
        uid_base: int,
        allow: Sequence[IPv4Network],
        dns: Sequence[str],
        lock_dir: Path,
    ):
        self.ip, self.nft, self.nsenter = ip, nft, nsenter
        self.subnet = subnet
        self.uid_base = uid_base
        self.allow = tuple(allow)
        self.dns = tuple(dns)
        self.lock_dir = lock_dir
        self._lock: int | None = None

    @classmethod
    def start(
        cls,
        *,
        subnet: IPv4Network,
        uid_base: int,
        uid_range: int,
        allow: Sequence[IPv4Network],
        dns: Sequence[str] | None,
        lock_dir: Path,
        uids: Sequence[int],
    ) -> Egress:
        """Install the host's rules (idempotent) and remove what a crashed
        executor left for `uids`; EgressUnavailable with the reason when this
        process cannot."""
        if os.geteuid() != 0:
            raise EgressUnavailable(
                "the executor is not root, so it cannot give a run its own network "
                "namespace and egress rules"
            )
        tools = {name: find_tool(name) for name in ("ip", "nft", "nsenter")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise EgressUnavailable(
                f"{', '.join(missing)} not installed (Debian's nftables, iproute2, "
                "util-linux: make system-deps)"
            )
        if subnet.num_addresses < 2 * uid_range:
            raise EgressUnavailable(
                f"CRONWHEEL_EXECUTOR_EGRESS_SUBNET {subnet} has fewer than two addresses "
                f"for each of the {uid_range} sandbox uids"
            )
        for net in allow:
            if net.overlaps(subnet):
                raise EgressUnavailable(
                    f"CRONWHEEL_EXECUTOR_EGRESS_ALLOW {net} overlaps the runs' own subnet {subnet}"
                )
        egress = cls(
            ip=tools["ip"] or "",
            nft=tools["nft"] or "",
            nsenter=tools["nsenter"] or "",
            subnet=subnet,
            uid_base=uid_base,
            allow=allow,
            dns=host_resolvers() if dns is None else dns,
            lock_dir=lock_dir,
        )
        egress._install(uids)
        return egress

    def _install(self, uids: Sequence[int]) -> None:
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = os.open(self.lock_dir / "egress.lock", os.O_RDWR | os.O_CREAT, 0o600)
        # Shared while this executor runs; blocks while the last one tears down.
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        try:
            _run([self.nft, "-f", "-"], ruleset(self.subnet, self.allow, self.dns))
            if IP_FORWARD.read_text().strip() != "1":
                (self.lock_dir / "egress.ip_forward-was").write_text("0")
                IP_FORWARD.write_text("1")
            for uid in uids:
                self.release(uid)  # what a crashed executor left behind
        except (OSError, subprocess.SubprocessError) as e:
            self.close()
            raise EgressUnavailable(f"cannot install the egress rules: {e}") from e

    def addresses(self, uid: int) -> tuple[str, str]:
        """(host end, run end) of uid's /31."""
        index = uid - self.uid_base
        host = self.subnet.network_address + 2 * index
        return str(host), str(host + 1)

    def resolv_conf(self) -> str:
        return "".join(f"nameserver {server}\n" for server in self.dns)

    def open(self, uid: int) -> str:
        """Make uid's namespace; its path, for nsenter --net. OSError if it
        cannot (the run then fails, retryably, as when bwrap cannot start)."""
        name, host_if = netns_name(uid), f"{HOST_IF}{uid}"
        host, run = self.addresses(uid)
        _run(
            [self.ip, "-batch", "-"],
            f"netns add {name}\n"
            f"link add {host_if} type veth peer name eth0 netns {name}\n"
            f"addr add {host}/31 dev {host_if}\n"
            f"link set {host_if} up\n",
        )
        _run(
            [self.ip, "-n", name, "-batch", "-"],
            f"link set lo up\naddr add {run}/31 dev eth0\nlink set eth0 up\n"
            f"route add default via {host}\n",
        )
        return str(NETNS_DIR / name)

    def release(self, uid: int) -> None:
        """Remove uid's namespace and veth, if there (deleting one end of a
        veth deletes both)."""
        subprocess.run(
            [self.ip, "-force", "-batch", "-"],
            input=f"link del {HOST_IF}{uid}\nnetns del {netns_name(uid)}\n",
            capture_output=True,
            text=True,
            check=False,
        )

    def close(self) -> None:
        """The last executor on the host to stop removes the table and turns
        forwarding back off if an executor turned it on."""
        if self._lock is None:
            return
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another executor still relies on the rules
        else:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _run([self.nft, "delete", "table", "inet", TABLE], "")
            was = self.lock_dir / "egress.ip_forward-was"
            with contextlib.suppress(OSError):
                if was.read_text().strip() == "0":
                    IP_FORWARD.write_text("0")
                was.unlink()
        finally:
            os.close(self._lock)
            self._lock = None


def _run(argv: list[str], stdin: str) -> None:
    """Run a tool; OSError with its first line of complaint if it fails."""
    got = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        first = (got.stderr.strip().splitlines() or [f"exit code {got.returncode}"])[0]
        raise OSError(f"{Path(argv[0]).name}: {first}")
