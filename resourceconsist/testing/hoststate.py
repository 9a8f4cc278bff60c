"""What a real node changes on its host: a snapshot to compare, and the sweep that undoes it.

A real node (``RealNodeCluster``, docs/testing.md "A real node") changes host-wide things that a
temporary directory cannot hold: processes that outlive their parent (containerd's shims and
the containers under them), mounts, a bridge and the pods' veth pairs, iptables chains, kernel
settings the kubelet writes, cgroups. This module holds:

- ``HostState.capture()``: those parts of the host as they are now, so a test can compare the
  host before a node started and after it stopped (``differences``);
- ``Footprint``: the record a node writes *before* it changes anything (its directories, bridge,
  cgroup, the kernel settings' values), kept on disk so that a start after a killed run knows what
  that run left;
- ``sweep(footprint)``: undo all of it, as the last step of every teardown and at the next start
  after a killed run; it returns what it could not remove, for one line naming the leftovers;
- ``HostLock``: one node per host at a time, held on an abstract unix socket, so it leaves no
  file behind and is released by the kernel when its holder dies, even by SIGKILL.

Why no library: the pieces are /proc and /sys reads and a handful of ``ip`` and
``iptables-restore`` calls; a netlink or iptables binding would add a compiled dependency to the
testing extra for less than what it replaces.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from resourceconsist.testing.controlplane import process_alive

#: The kernel settings a node's components may change (the kubelet's kernel tunables, the CNI
#: bridge's forwarding, kube-proxy's conntrack and localhost NodePorts), restored by ``sweep``.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.ip_forward",
    "net.ipv6.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
)
#: The iptables chains of the kubelet, kube-proxy and the CNI plugins start so. A node refuses
#: to start where such chains exist already (another Kubernetes node runs on the host), so at a
#: teardown every chain of these names is the node's own.
CHAIN_PREFIXES = ("KUBE-", "CNI-")
#: Programs of a node, whatever their command line (containerd's shims re-parent to init).
NODE_PROGRAMS = frozenset(
    {"containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "kubelet", "kube-proxy"}
)
_CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Where the CNI library caches each sandbox's result, and where containerd 1.6's shims put
#: their sockets, whatever containerd's own state directory.
_CNI_CACHE = Path("/var/lib/cni")
_SHIM_SOCKETS = Path("/run/containerd/s")
_MNT_DETACH = 2
_LOCK_NAME = b"\0resourceconsist-real-node"
#: A chain's packet and byte counters in ``iptables-save`` (``:INPUT ACCEPT [12:345]``).
_COUNTERS = re.compile(r" \[\d+:\d+\]$")
#: A built-in chain with its default policy, all an untouched table holds.
_BUILTIN_ACCEPT = re.compile(r"^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT( \[\d+:\d+\])?$")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    """The current value of each setting the kernel has (absent ones are left out)."""
    values = {}
    for name in names:
        try:
            values[name] = _sysctl_path(name).read_text().strip()
        except OSError:
            continue
    return values


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _proc_cgroups(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def mount_points() -> list[tuple[str, str, str]]:
    """(mount point, file system type, source) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        # Mount points escape spaces and such as octal (\040).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        found.append((point, fields[sep + 1], fields[sep + 2]))
    return found


def links() -> set[str]:
    """The host's network interfaces."""
    return set(os.listdir("/sys/class/net"))


#: A socket's state in /proc/net: a TCP socket listening, a UDP socket bound (unconnected).
_LISTENING = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}


def _open_sockets() -> Iterator[tuple[str, str, int, str]]:
    """(protocol, address, port, inode) of every TCP socket listening and UDP socket bound, from
    /proc/net (this network namespace's)."""
    for proto, listening in _LISTENING.items():
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == listening:
                address, port = _decode_address(fields[1])
                yield proto, address, port, fields[9]


def _listeners() -> set[str]:
    """Sockets listening (or bound, UDP) on an address other than loopback's (other processes
    come and go on loopback; a node's listeners there die with it)."""
    return {
        f"{proto} {address}:{port}"
        for proto, address, port, _inode in _open_sockets()
        if address != "::1" and not address.startswith("127.")
    }


def _decode_address(hexed: str) -> tuple[str, int]:
    """/proc/net/tcp's ``0100007F:1F90`` as (``127.0.0.1``, 8080)."""
    host, port = hexed.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in its own byte order (little-endian here).
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def listeners_of(pids: Iterable[int]) -> set[str]:
    """``address:port`` of the TCP sockets the processes listen on (any address)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return {
        f"{address}:{port}"
        for proto, address, port, inode in _open_sockets()
        if proto.startswith("tcp") and inode in inodes
    }


def iptables_rules() -> list[str]:
    """``iptables-save`` and ``ip6tables-save``, counters and comments aside, one rule a line."""
    lines = []
    for command in ("iptables-save", "ip6tables-save"):
        if shutil.which(command) is None:
            continue
        out = subprocess.run([command], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("#"):
                continue
            lines.append(f"{command[:-5]} {_COUNTERS.sub('', line)}")
    if shutil.which("nft") is not None:
        out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
        lines.extend(f"nft {line}" for line in out.splitlines())
    return lines


def _cgroup_hierarchies() -> list[Path]:
    """/sys/fs/cgroup itself on cgroup v2, each controller's hierarchy on v1."""
    if (_CGROUP_ROOT / "cgroup.controllers").exists():
        return [_CGROUP_ROOT]
    return sorted(p for p in _CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


def cgroup_dirs() -> set[str]:
    """Every cgroup directory, in every hierarchy."""
    found = set()
    for hierarchy in _cgroup_hierarchies():
        for directory, _subdirs, _files in os.walk(hierarchy):
            found.add(directory)
    return found


@dataclass(frozen=True)
class HostState:
    """The parts of the host a node changes, as they are at one moment."""

    processes: frozenset[str]
    mounts: frozenset[str]
    links: frozenset[str]
    iptables: tuple[str, ...]
    sysctls: tuple[tuple[str, str], ...]
    cgroups: frozenset[str]
    listeners: frozenset[str]

    @classmethod
    def capture(cls) -> HostState:
        """Now: node programs' processes (containerd, shims, runc, kubelet, kube-proxy) and
        containers' (in a kubelet's ``kubepods`` cgroup, whatever their program), every
        mount, network interface, iptables rule and cgroup, ``SYSCTLS``' values, and the
        sockets listening on an address other than loopback."""
        # A zombie holds nothing of the host and no sweep can kill it: a killed shim re-parented
        # to an init that reaps late (a CI machine's) stays one for a while.
        processes = {
            f"{pid} {_proc_name(pid)}"
            for pid in _pids()
            if (_proc_name(pid) in NODE_PROGRAMS or "/kubepods/" in _proc_cgroups(pid)) and process_alive(pid)
        }
        return cls(
            processes=frozenset(processes),
            mounts=frozenset(" ".join(m) for m in mount_points()),
            links=frozenset(links()),
            iptables=tuple(iptables_rules()),
            sysctls=tuple(sorted(read_sysctls().items())),
            cgroups=frozenset(cgroup_dirs()),
            listeners=frozenset(_listeners()),
        )

    def differences(self, after: HostState) -> list[str]:
        """One line per part that differs: what ``after`` has that this has not, and the reverse."""
        lines = []
        for name in ("processes", "mounts", "links", "iptables", "sysctls", "cgroups", "listeners"):
            before_set, after_set = set(getattr(self, name)), set(getattr(after, name))
            if before_set != after_set:
                added, removed = sorted(after_set - before_set), sorted(before_set - after_set)
                lines.append(f"{name}: added {added}, removed {removed}")
        return lines


@dataclass
class Footprint:
    """What one node changes on its host, written to ``path`` before it changes it."""

    path: Path
    owner: int
    #: Directories the node owns whole (containerd's root and state, the kubelet's root).
    roots: list[str]
    bridge: str
    cgroup: str
    #: Kernel settings as they were before the node started.
    sysctls: dict[str, str]
    #: Host directories the node's components create outside ``roots`` (containerd's shim
    #: sockets, the CNI cache, the kubelet's log links) that did not exist before: removed when
    #: empty.
    created: list[str] = field(default_factory=list)
    #: Address of the node's containerd, which its shims name on their command lines.
    containerd_address: str = ""
    #: The CNI network's name: the CNI cache files of its sandboxes carry it.
    network: str = ""
    #: The nftables tables before the node started (``family name``): iptables-nft makes a
    #: table on first use, and one made for the node is deleted once it is empty again.
    nft_tables: list[str] = field(default_factory=list)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        data["path"] = str(self.path)
        self.path.write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: Path) -> Footprint | None:
        """The record at ``path``, or None when there is none (or it is unreadable: then the
        sweep of a fresh footprint, with the same fixed names, still finds what is left)."""
        try:
            data = json.loads(path.read_text())
            data["path"] = Path(data["path"])
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def node_processes(footprint: Footprint) -> set[int]:
    """Processes of the node: those naming its directories or containerd on their command line
    (containerd, the shims, the kubelet, kube-proxy) and those in its cgroup (the containers)."""
    marks = [*footprint.roots, footprint.containerd_address]
    marks = [m for m in marks if m]
    cgroup = f"/{footprint.cgroup}/"
    found = set()
    for pid in _pids():
        if pid == os.getpid():
            continue
        cmdline = _proc_cmdline(pid)
        if any(mark in cmdline for mark in marks) or cgroup in _proc_cgroups(pid):
            found.add(pid)
    return found


#: How long no node process must be seen before the sweep believes they are all gone: a shim
#: forked by one killed an instant before can be in its ``exec`` when looked at, its command line
#: empty, and live on once the exec ends (a CI run left one behind that way).
_QUIET_SECONDS = 0.5


def _kill_all(footprint: Footprint, deadline: float) -> list[str]:
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        pids = node_processes(footprint)
        if not pids:
            now = time.monotonic()
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= _QUIET_SECONDS:
                return []
            time.sleep(0.05)
            continue
        quiet_since = None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.1)
    return [f"process {pid} ({_proc_name(pid)})" for pid in sorted(node_processes(footprint))]


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _unmount_all(roots: list[str], deadline: float) -> list[str]:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    while time.monotonic() < deadline:
        points = sorted({p for p, _t, _s in mount_points() if _under(p, roots)}, key=len, reverse=True)
        if not points:
            return []
        for point in points:
            libc.umount2(point.encode(), _MNT_DETACH)
        time.sleep(0.05)
    return [f"mount {p}" for p, _t, _s in mount_points() if _under(p, roots)]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _remove_links(bridge: str, deadline: float) -> list[str]:
    # A pod's veth goes with its network namespace once nothing holds that; one whose namespace
    # is gone but which is still enslaved to the bridge is deleted here.
    while time.monotonic() < deadline:
        enslaved = [
            name for name in links() if Path(f"/sys/class/net/{name}/master").resolve().name == bridge
        ]
        for name in enslaved:
            _ip("link", "delete", name)
        if bridge in links():
            _ip("link", "delete", bridge)
        if bridge not in links() and not enslaved:
            return []
        time.sleep(0.05)
    return [f"link {bridge}"] if bridge in links() else []


def _node_chain(name: str) -> bool:
    return name.startswith(CHAIN_PREFIXES)


def node_chains() -> list[str]:
    """``family table chain`` of every iptables chain a node's components make."""
    found = []
    for family in ("iptables", "ip6tables"):
        if shutil.which(f"{family}-save") is None:
            continue
        table = ""
        out = subprocess.run([f"{family}-save"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and _node_chain(line[1:].split()[0]):
                found.append(f"{family} {table} {line[1:].split()[0]}")
    return found


def _chain_removal(saved: str) -> list[str]:
    """The ``iptables-restore --noflush`` lines that remove a node's chains from ``saved`` (an
    ``iptables-save`` output): per table, each node chain declared (which flushes it), the rules
    of the other chains that jump to one deleted, then the node chains deleted."""
    script: list[str] = []
    table, deletes, chains = "", list[str](), list[str]()
    for line in saved.splitlines():
        if line.startswith("*"):
            table, deletes, chains = line[1:], list[str](), list[str]()
        elif line == "COMMIT" and (deletes or chains):
            script.append(f"*{table}")
            script.extend(f":{c} - [0:0]" for c in chains)
            script.extend(deletes)
            script.extend(f"-X {c}" for c in chains)
            script.append("COMMIT")
        elif line.startswith(":") and _node_chain(line[1:].split()[0]):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A "):
            parts = line.split()
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if not _node_chain(parts[1]) and _node_chain(target):
                deletes.append("-D " + line[3:])
    return script


def _remove_chains() -> list[str]:
    """Remove the node's chains and the jumps to them, in every table of both families, each
    family in one atomic ``iptables-restore --noflush``."""
    for family in ("iptables", "ip6tables"):
        if shutil.which(f"{family}-save") is None:
            continue
        saved = subprocess.run([f"{family}-save"], capture_output=True, text=True, check=False).stdout
        script = _chain_removal(saved)
        if script:
            restore, text = [f"{family}-restore", "--noflush"], "\n".join(script) + "\n"
            subprocess.run(restore, input=text, capture_output=True, text=True, check=False)
    return [f"iptables chain {c}" for c in node_chains()]


def nft_tables() -> list[str]:
    """``family name`` of each nftables table (empty without the nft command)."""
    if shutil.which("nft") is None:
        return []
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
    return [line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")]


def _remove_empty_tables(before: list[str]) -> list[str]:
    """Delete the iptables tables iptables-nft made for the node, once no rule and no chain of
    their own is left in them (their built-in chains are all they hold, policy ACCEPT)."""
    for family, nft_family in (("iptables", "ip"), ("ip6tables", "ip6")):
        if shutil.which(f"{family}-save") is None:
            continue
        out = subprocess.run([f"{family}-save"], capture_output=True, text=True, check=False).stdout
        table, empty = "", True
        for line in out.splitlines():
            if line.startswith("*"):
                table, empty = line[1:], True
            elif line.startswith("-A ") or (line.startswith(":") and not _BUILTIN_ACCEPT.match(line)):
                empty = False
            elif line == "COMMIT" and empty and f"{nft_family} {table}" not in before:
                delete = ["nft", "delete", "table", nft_family, table]
                subprocess.run(delete, capture_output=True, check=False)
    made = set(nft_tables()) - set(before)
    return [f"nftables table {t}" for t in sorted(made)]


def _restore_sysctls(values: dict[str, str]) -> list[str]:
    left = []
    now = read_sysctls(values)
    for name, value in values.items():
        if now.get(name, value) == value:
            continue
        try:
            _sysctl_path(name).write_text(value)
        except OSError:
            left.append(f"sysctl {name}={now[name]} (was {value})")
    return left


def _remove_cgroups(name: str, deadline: float) -> list[str]:
    tops = [h / name for h in _cgroup_hierarchies() if (h / name).is_dir()]
    while tops and time.monotonic() < deadline:
        for top in tops:
            for directory, _subdirs, _files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                try:
                    os.rmdir(directory)
                except OSError:
                    continue
        tops = [t for t in tops if t.is_dir()]
        if tops:
            time.sleep(0.1)
    return [f"cgroup {t}" for t in tops]


def _remove_cni_cache(network: str) -> None:
    """The CNI library's cache of the node's sandboxes (``<network>-<id>-eth0`` and their
    loopback's ``cni-loopback-<id>-lo``), left when a sandbox was never torn down."""
    results = _CNI_CACHE / "results"
    if not network or not results.is_dir():
        return
    ids = set()
    for entry in results.glob(f"{network}-*"):
        ids.add(entry.name[len(network) + 1 :].rsplit("-", 1)[0])
        entry.unlink(missing_ok=True)
    for sandbox in ids:
        (results / f"cni-loopback-{sandbox}-lo").unlink(missing_ok=True)


def _remove_stale_sockets(directory: Path) -> None:
    """Sockets no process listens on any more (a killed shim's), in containerd's shim directory."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if not entry.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(entry))
            except ConnectionRefusedError:
                entry.unlink(missing_ok=True)
            except OSError:
                continue


def _remove_created(footprint: Footprint) -> None:
    """Host directories the node made: links into its roots removed, then each removed when empty."""
    for created in sorted(footprint.created, key=len, reverse=True):
        path = Path(created)
        if not path.is_dir():
            continue
        for entry in path.iterdir():
            if entry.is_symlink() and _under(os.readlink(entry), footprint.roots):
                entry.unlink()
        for directory, _subdirs, _files in sorted(os.walk(path), key=lambda w: len(w[0]), reverse=True):
            try:
                os.rmdir(directory)
            except OSError:
                continue


def sweep(footprint: Footprint, *, timeout: float = 30.0) -> list[str]:
    """Undo what the node recorded in ``footprint`` changed: its processes killed, its mounts
    detached, its links, iptables chains and cgroups removed, the kernel settings restored, its
    directories deleted; the record last. Returns what is left (empty: nothing)."""
    deadline = time.monotonic() + timeout
    left = _kill_all(footprint, deadline)
    left += _unmount_all(footprint.roots, deadline)
    left += _remove_links(footprint.bridge, deadline)
    left += _remove_chains()
    left += _remove_empty_tables(footprint.nft_tables)
    left += _restore_sysctls(footprint.sysctls)
    left += _remove_cgroups(footprint.cgroup, deadline)
    _remove_cni_cache(footprint.network)
    _remove_stale_sockets(_SHIM_SOCKETS)
    _remove_created(footprint)
    if not any(_under(p, footprint.roots) for p, _t, _s in mount_points()):
        for root in footprint.roots:
            shutil.rmtree(root, ignore_errors=True)
    left += [f"directory {r}" for r in footprint.roots if Path(r).exists()]
    if not left:
        footprint.path.unlink(missing_ok=True)
    return left


class HostLock:
    """One real node per host: an abstract unix socket bound under a fixed name (network
    namespace wide, no file; the kernel frees it when the holder exits, even when killed)."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None

    def acquire(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(_LOCK_NAME)
        except OSError:
            sock.close()
            return False
        self._socket = sock
        return True

    def release(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    @property
    def held(self) -> bool:
        return self._socket is not None
