"""What the slot server tells a run's child, and what the child reports back, in fixed fields.

The kind of run (``Kind``), the program's limits (``RunSpec.program_meta``) and the layers
report (``LAYERS_REPORT``) are packed binary fields, not JSON: every Python object a child
touches for the first time is a copy-on-write page fault (its heap is the template's), and
parsing and building JSON in every child cost ~80 of them per run. Standard library only.
"""

from __future__ import annotations

import struct

#: The layer names and order of ``sandbox.types.ALL_LAYERS`` (the slot server cannot import the
#: package's public modules).
ALL_LAYERS = (
    "empty_env", "session", "cgroup", "pid_ns", "net_ns", "mount_ns", "ipc_ns", "uid", "rlimits",
    "no_new_privs", "landlock", "seccomp",
)  # fmt: skip
#: A child reports its layers as a bit mask (bit i: ``ALL_LAYERS[i]``), not a list of names in
#: JSON: building, sorting and encoding the list cost every child ~50 page faults (every object
#: a child touches for the first time is a copy-on-write fault), ~0.1 ms.
LAYER_BIT = {name: 1 << i for i, name in enumerate(ALL_LAYERS)}
#: The bit of a required layer this code does not know (never present, so always "missing").
UNKNOWN_LAYER = 1 << 31
EMPTY_ENV_BIT = LAYER_BIT["empty_env"]
SESSION_BIT = LAYER_BIT["session"]
CGROUP_BIT = LAYER_BIT["cgroup"]
PID_NS_BIT = LAYER_BIT["pid_ns"]
NET_NS_BIT = LAYER_BIT["net_ns"]
MOUNT_NS_BIT = LAYER_BIT["mount_ns"]
IPC_NS_BIT = LAYER_BIT["ipc_ns"]
UID_BIT = LAYER_BIT["uid"]
RLIMITS_BIT = LAYER_BIT["rlimits"]
NO_NEW_PRIVS_BIT = LAYER_BIT["no_new_privs"]
LANDLOCK_BIT = LAYER_BIT["landlock"]
SECCOMP_BIT = LAYER_BIT["seccomp"]
#: The layers report: ``b"L"`` and the mask.
LAYERS_REPORT = struct.Struct("=cI")


def layer_mask(names: list[str]) -> int:
    """Return the bit mask of ``names`` (unknown names get ``UNKNOWN_LAYER``)."""
    mask = 0
    for name in names:
        mask |= LAYER_BIT.get(name, UNKNOWN_LAYER)
    return mask


def layer_names(mask: int) -> list[str]:
    """Return the layer names of ``mask``, in ``ALL_LAYERS`` order."""
    return [name for i, name in enumerate(ALL_LAYERS) if mask >> i & 1]


class Kind:
    """The kind of run a fresh child is prepared for (sent by the slot server, not the template)."""

    __slots__ = ("host_workdir", "max_file_mb", "mount_ns", "network")

    #: ``b"K"``, network, mount_ns, max_file_mb; then the host work dir as UTF-8. Fixed binary
    #: fields, not JSON: every child parses one.
    _LAYOUT = struct.Struct("=c??I")

    def __init__(self, network: bool, max_file_mb: int, mount_ns: bool, host_workdir: str) -> None:
        self.network = network
        self.max_file_mb = max_file_mb
        self.mount_ns = mount_ns
        self.host_workdir = host_workdir

    def pack(self) -> bytes:
        """Return the message that tells a child its kind of run (sent with its two pipes)."""
        head = self._LAYOUT.pack(b"K", self.network, self.mount_ns, self.max_file_mb)
        return head + self.host_workdir.encode()

    @classmethod
    def unpack(cls, message: bytes) -> Kind | None:
        """Inverse of ``pack``; None for anything else (the slot server discarded the child)."""
        if len(message) < cls._LAYOUT.size or message[:1] != b"K":
            return None
        _k, network, mount_ns, max_file_mb = cls._LAYOUT.unpack_from(message)
        workdir = message[cls._LAYOUT.size :].decode()
        return cls(network, max_file_mb, mount_ns, workdir)


class RunSpec:
    """One run's parameters, parsed from the request (trusted: it comes from the library)."""

    def __init__(self, req: dict[str, object]) -> None:
        limits = req.get("limits")
        if not isinstance(limits, dict):
            raise ValueError("missing limits")
        self.code = str(req.get("code", ""))
        self.stdin = str(req.get("stdin", ""))
        files = req.get("files") or {}
        self.files = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
        self.timeout_s = float(limits["timeout_s"])
        self.cpu_s = int(limits["cpu_s"])
        self.memory_mb = int(limits["memory_mb"])
        # RLIMIT_AS: ``memory_mb`` unless the library allowed a language's runtime more address
        # space (the JVM reserves ~0.5 GB it never touches; the cgroup still bounds real memory).
        self.address_space_mb = int(limits.get("address_space_mb", self.memory_mb))
        self.output_bytes = int(limits["output_bytes"])
        self.max_processes = int(limits["max_processes"])
        self.max_file_mb = int(limits["max_file_mb"])
        self.network = bool(limits["network"])
        required = req.get("required") or []
        self.required = [str(x) for x in required] if isinstance(required, list) else []
        entry = req.get("entry_point")
        self.entry_point: str | None = str(entry) if entry else None  # run_tests (serve mode)

    def program_meta(self) -> bytes:
        """Pack what a child needs besides its texts: fixed binary fields, then the entry point.

        Not JSON: parsing it (and building a dict and a RunSpec from it) cost every child
        ~30 page faults. cpu_s, address_space_mb, max_file_mb, max_processes (bounded far below
        2^32 by ``sandbox.types``), the required layers' mask, then the entry point as UTF-8
        (an identifier or nothing), a NUL and the names of required layers this code does
        not know (``UNKNOWN_LAYER``: always missing, named in the child's refusal).
        """
        head = PROGRAM_META.pack(
            self.cpu_s, self.address_space_mb, self.max_file_mb, self.max_processes,
            layer_mask(self.required),
        )  # fmt: skip
        unknown = ", ".join(name for name in self.required if name not in LAYER_BIT)
        return head + f"{self.entry_point or ''}\0{unknown}".encode()


#: ``RunSpec.program_meta``'s fixed fields.
PROGRAM_META = struct.Struct("=5I")

#: T's reply to a clone command (``_template``, ``_spawn.Template``): b"P" and the pid, or b"E"
#: and an errno; then whether the clone got a PID namespace of its own.
TEMPLATE_REPLY = struct.Struct("=cib")
