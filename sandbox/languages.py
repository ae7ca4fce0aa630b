r"""The languages the sandbox runs, their toolchains, and the trusted launchers that run them.

Every language runs under the same isolation as Python: the child applies every layer, then
runs a small **trusted launcher** (Python, generated here from fixed argument lists) in place
of a Python program, which ``os.execv``\s the interpreter or the compiled binary. seccomp,
Landlock, the namespaces, the uid and the rlimits are already in force and carry over the
exec unchanged.

A compiled language compiles **in the sandbox too** (hostile source fed to a compiler:
``#include "/etc/shadow"``, template or const-eval bombs): the compile is a sandbox run of a
launcher that runs the compiler as a subprocess in the work dir and writes what it built to
stdout as one framed, compressed, base64 line (``ARTIFACT_PREFIX``). The library checks only its
frame and size and hands it, still untrusted, to each test's run as an input file, where the
run launcher unpacks it and executes it. What the compile produced is only ever executed inside
the sandbox again.

Names are SandboxFusion's: ``python``, ``cpp``, ``java``, ``nodejs``, ``rust``, ``bash``.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from enum import StrEnum


class Language(StrEnum):
    """A language the sandbox runs (SandboxFusion's names)."""

    PYTHON = "python"
    CPP = "cpp"
    JAVA = "java"
    NODEJS = "nodejs"
    RUST = "rust"
    BASH = "bash"


class LanguageUnavailableError(ValueError):
    """A language's toolchain is not installed here (the message names what is missing)."""


#: Folders searched for toolchain programs besides ``$PATH`` (rustup installs under ~/.cargo).
EXTRA_SEARCH_DIRS: tuple[str, ...] = (
    "/usr/local/bin", "/usr/bin", "/bin", os.path.expanduser("~/.cargo/bin"),
)  # fmt: skip
#: The first line of a compile run's stdout: this prefix, then the base64 of the zlib-compressed
#: files the compiler wrote (``_pack_outputs``).
ARTIFACT_PREFIX = "ARTIFACT1:"
#: The most a compile may write to stdout (the framed artifact): a hello world is ~15 KB in
#: C++, ~200 KB in Rust (stripped, compressed); every test run receives it as an input file.
ARTIFACT_MAX_BYTES = 8 << 20
#: What a run request of another language may carry besides the caller's stdin and files: the
#: program (at most ``ARTIFACT_MAX_BYTES``) and the launcher (``MAX_REQUEST_BYTES`` counts it).
RUN_RESERVE_BYTES = ARTIFACT_MAX_BYTES + (16 << 10)
#: The input file a run of a compiled program receives its artifact in.
ARTIFACT_FILE = "program.b64"
#: Folder (in the work dir) the compiler writes to and the program runs from.
OUT_DIR = "out"
#: How much of the compiler's output the compile launcher keeps (the first errors matter).
COMPILER_LOG_BYTES = 64 << 10
#: Exit status of the compile launcher when the compiler was killed by the CPU limit.
COMPILE_TIMEOUT_EXIT = 124

#: JVM flags that let it start within the sandbox's limits: the serial collector and one JIT
#: thread (each GC/JIT thread counts against ``max_processes``), a small code cache and class
#: space (the JVM reserves 1 GB of class space by default, over the whole address-space
#: limit), no perf-data file in the work dir. Even so the JVM reserves ~0.8 GB of address space
#: it never touches, so Java gets ``JVM_ADDRESS_SPACE_MB`` more ``RLIMIT_AS`` than
#: ``memory_mb``; its heap (``-Xmx``) is 3/4 of ``memory_mb`` and the run's cgroup (memory_mb)
#: still bounds the memory it really uses.
_JVM_FLAGS = (
    "-Xss16m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1",
    "-XX:ReservedCodeCacheSize=32m", "-XX:CompressedClassSpaceSize=64m",
    "-XX:MaxMetaspaceSize=192m", "-XX:-UsePerfData", "-Xshare:auto",
)  # fmt: skip
JVM_ADDRESS_SPACE_MB = 1024
#: V8 reserves its code range and heap reservations up front (``Failed to reserve virtual memory
#: for CodeRange`` below ~0.5 GB of address space); node gets this much more ``RLIMIT_AS``, its
#: old space is 3/4 of ``memory_mb``, and the cgroup bounds the memory it really uses.
V8_ADDRESS_SPACE_MB = 1024


#: g++'s flags for programs; the precompiled header is built with the same (GCC ignores a
#: precompiled header made with other flags, silently falling back to the header itself).
CPP_FLAGS = ("-std=gnu++17", "-O2")


@dataclass(frozen=True)
class Toolchain:
    """How one language is compiled and run (absolute paths, resolved on this machine).

    ``compile_argv`` runs in the work dir with ``source_name`` there and writes into
    ``OUT_DIR``; empty for interpreted languages. ``run_argv`` runs in the work dir; ``{heap}``
    in it becomes the runtime's heap size in MiB (3/4 of the run's ``memory_mb``).
    """

    language: Language
    source_name: str
    compile_argv: tuple[str, ...]
    run_argv: tuple[str, ...]
    expose_dirs: tuple[str, ...] = ()
    """Folders runs must read although the sandbox hides what holds them (rustc's sysroot)."""
    compile_timeout_s: float = 10.0
    compile_memory_mb: int = 2048
    address_space_mb: int = 0
    """Extra RLIMIT_AS the runtime reserves without using (runs; the cgroup still bounds)."""
    compile_address_space_mb: int = 0
    memory_markers: tuple[str, ...] = ()
    """Lines on stderr by which the runtime says it ran out of memory (status ``MEMORY``)."""
    pch_dir: str | None = None
    """C++: the folder of the precompiled ``<bits/stdc++.h>`` (``ensure_precompiled_header``),
    on the compile's include path and exposed read-only to runs."""

    @property
    def compiled(self) -> bool:
        """True when the language has a compile step."""
        return bool(self.compile_argv)

    def run_command(self, memory_mb: int) -> list[str]:
        """Return the run's argv for a run of ``memory_mb``."""
        heap = str(max(16, memory_mb * 3 // 4))
        return [arg.replace("{heap}", heap) for arg in self.run_argv]


def parse_language(name: object) -> Language:
    """Return the ``Language`` called ``name`` (``ValueError`` listing the valid names).

    >>> parse_language("cpp")
    <Language.CPP: 'cpp'>
    >>> parse_language("c++")
    Traceback (most recent call last):
    ...
    ValueError: unknown language 'c++': valid languages are python, cpp, java, nodejs, rust, bash
    """
    if isinstance(name, str) and name in Language._value2member_map_:
        return Language(name)
    valid = ", ".join(lang.value for lang in Language)
    raise ValueError(f"unknown language {name!r}: valid languages are {valid}")


def search_path() -> str:
    """Return the folders programs are looked up in: ``$PATH``, then ``EXTRA_SEARCH_DIRS``."""
    return os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_SEARCH_DIRS])


def find_program(name: str) -> str | None:
    """Return the absolute path of program ``name`` (``search_path``), or None."""
    found = shutil.which(name, path=search_path())
    return os.path.abspath(found) if found else None


#: What to install, per language, when a program is missing.
_INSTALL_HINTS = {
    Language.PYTHON: "/usr/bin/python3 (apt-get install python3)",
    Language.CPP: "g++ (apt-get install g++)",
    Language.JAVA: "a JDK 17 (apt-get install openjdk-17-jdk-headless)",
    Language.NODEJS: "Node.js 20 (apt-get install nodejs, or the NodeSource packages)",
    Language.RUST: "a Rust toolchain (rustup: https://rustup.rs) and a C linker `cc` (gcc)",
    Language.BASH: "bash (apt-get install bash)",
}
#: The programs each language needs (a compiler that links also needs ``cc``).
_PROGRAMS = {
    Language.PYTHON: ("python3",),
    Language.CPP: ("g++",),
    Language.JAVA: ("javac", "java"),
    Language.NODEJS: ("node",),
    Language.RUST: ("rustc", "cc"),
    Language.BASH: ("bash",),
}


@functools.cache
def _rust_sysroot(rustc: str) -> str:
    """Return the real toolchain folder behind ``rustc`` (often a rustup proxy)."""
    try:
        out = subprocess.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LanguageUnavailableError(
            f"language 'rust' is unavailable: `{rustc} --print sysroot` failed ({exc}); "
            f"install {_INSTALL_HINTS[Language.RUST]}"
        ) from None
    sysroot = out.stdout.strip()
    if out.returncode != 0 or not os.path.isfile(os.path.join(sysroot, "bin", "rustc")):
        raise LanguageUnavailableError(
            f"language 'rust' is unavailable: `{rustc} --print sysroot` did not name a "
            f"toolchain ({out.stderr.strip()[:200]!r}); install {_INSTALL_HINTS[Language.RUST]}"
        )
    return os.path.realpath(sysroot)


def _rust_libdir(sysroot: str) -> str:
    """Return the folder of the toolchain's ``libstd-*.so`` (its host target's)."""
    found = sorted(glob.glob(f"{sysroot}/lib/rustlib/*/lib/libstd-*.so"))
    return os.path.dirname(found[0]) if found else f"{sysroot}/lib"


def require_language(name: object) -> Toolchain:
    """Return the toolchain of language ``name`` on this machine.

    Raises:
        ValueError: ``name`` is no language (the message lists the valid ones).
        LanguageUnavailableError: a program it needs is missing (named, with what to install).
    """
    lang = parse_language(name)
    paths: dict[str, str] = {}
    for program in _PROGRAMS[lang]:
        found = "/usr/bin/python3" if lang is Language.PYTHON else find_program(program)
        if found is None or not os.access(found, os.X_OK):
            raise LanguageUnavailableError(
                f"language {lang.value!r} is unavailable: program `{program}` not found in "
                f"{search_path()!r}; install {_INSTALL_HINTS[lang]}"
            )
        paths[program] = found
    return _toolchain(lang, paths)


def _toolchain(lang: Language, paths: dict[str, str]) -> Toolchain:
    if lang is Language.PYTHON:
        return Toolchain(lang, "main.py", (), (paths["python3"], "main.py"))
    if lang is Language.CPP:
        pch = precompiled_header_dir(paths["g++"])
        return Toolchain(
            lang, "main.cpp",
            (paths["g++"], *CPP_FLAGS, "-pipe", *(("-I", pch) if pch else ()),
             "-o", f"{OUT_DIR}/main", "main.cpp"),
            (f"{OUT_DIR}/main",),
            expose_dirs=(pch,) if pch else (),
            compile_timeout_s=20.0,
            memory_markers=("std::bad_alloc",),
            pch_dir=pch,
        )  # fmt: skip
    if lang is Language.JAVA:
        javac_flags = tuple(f"-J{flag}" for flag in _JVM_FLAGS if flag != "-Xss16m")
        return Toolchain(
            lang, "Main.java",
            (paths["javac"], "-J-Xmx512m", *javac_flags, "-encoding", "UTF-8", "-d", OUT_DIR,
             "Main.java"),
            (paths["java"], "-Xmx{heap}m", *_JVM_FLAGS, "-cp", OUT_DIR, "Main"),
            compile_timeout_s=20.0,
            address_space_mb=JVM_ADDRESS_SPACE_MB,
            compile_address_space_mb=JVM_ADDRESS_SPACE_MB,
            memory_markers=("java.lang.OutOfMemoryError",),
        )  # fmt: skip
    if lang is Language.NODEJS:
        return Toolchain(
            lang, "main.js", (),
            (paths["node"], "--max-old-space-size={heap}", "--stack-size=4000", "main.js"),
            address_space_mb=V8_ADDRESS_SPACE_MB,
            memory_markers=(
                "JavaScript heap out of memory", "Array buffer allocation failed",
                "Invalid array length", "Fatal process out of memory",
            ),
        )  # fmt: skip
    if lang is Language.RUST:
        sysroot = _rust_sysroot(paths["rustc"])
        return Toolchain(
            lang, "main.rs",
            # Linked against the toolchain's own libstd (exposed to runs at the same path):
            # a 5 KB program instead of 340 KB, which every test's run receives and unpacks.
            (f"{sysroot}/bin/rustc", "--edition", "2021", "-O", "-C", "strip=symbols",
             "-C", "prefer-dynamic", "-C", f"link-args=-Wl,-rpath,{_rust_libdir(sysroot)}",
             "-o", f"{OUT_DIR}/main", "main.rs"),
            (f"{OUT_DIR}/main",),
            expose_dirs=(sysroot,),
            compile_timeout_s=20.0,
            memory_markers=("memory allocation of",),
        )  # fmt: skip
    return Toolchain(
        lang, "main.sh", (), (paths["bash"], "main.sh"), memory_markers=("cannot allocate",)
    )


def cache_dir() -> str:
    """Return the folder of the sandbox's build caches.

    ``$GRPO_SANDBOX_CACHE``, else ``grpo-sandbox`` in ``$XDG_CACHE_HOME`` or ``~/.cache``.
    """
    explicit = os.environ.get("GRPO_SANDBOX_CACHE")
    if explicit:
        return os.path.abspath(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(os.path.abspath(base), "grpo-sandbox")


@functools.cache
def _gxx_version(gxx: str) -> str:
    try:
        out = subprocess.run(
            [gxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def precompiled_header_dir(gxx: str) -> str | None:
    """Return the folder of ``gxx``'s precompiled ``<bits/stdc++.h>`` (None: unknown g++).

    One folder per compiler and flags (a hash of its path, version and ``CPP_FLAGS``).
    """
    version = _gxx_version(gxx)
    if not version:
        return None
    key = "\0".join([os.path.realpath(gxx), version, *CPP_FLAGS])
    return os.path.join(cache_dir(), f"cpp-pch-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def prepare_cache_dirs(toolchains: list[Toolchain]) -> None:
    """Create the cache folders of ``toolchains``; one that cannot be made is left out.

    Called before a Sandbox starts: only folders that exist then are exposed to its runs.
    """
    for toolchain in toolchains:
        if toolchain.pch_dir is not None:
            try:
                os.makedirs(toolchain.pch_dir, mode=0o755, exist_ok=True)
            except OSError:
                continue


_PCH_LOCK = threading.Lock()
_PCH_FAILED: set[str] = set()


def ensure_precompiled_header(toolchain: Toolchain) -> bool:
    """Build the precompiled ``<bits/stdc++.h>`` of a C++ toolchain once; True when it exists.

    ``#include <bits/stdc++.h>`` (most competitive-programming C++) costs ~1.3 s of parsing per
    compile; with the precompiled header ~0.35 s (measured with g++ 12). It is built here, in
    the library process, by the host's g++ from the system's own headers and nothing of a job
    (trusted input), written under a temporary name and renamed into place (several processes
    may race; each rename is atomic), world-readable. Runs read it through their read-only view
    of the folder. On failure programs compile without it (slower, same result).
    """
    folder = toolchain.pch_dir
    if folder is None or not toolchain.compiled:
        return False
    target = os.path.join(folder, "bits", "stdc++.h.gch")
    if os.path.exists(target):
        return True
    with _PCH_LOCK:
        if os.path.exists(target) or folder in _PCH_FAILED:
            return os.path.exists(target)
        try:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            with tempfile.TemporaryDirectory() as scratch:
                stub = os.path.join(scratch, "stdc++.h")
                with open(stub, "w") as handle:
                    handle.write("#include <bits/stdc++.h>\n")
                partial = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
                try:
                    subprocess.run(
                        [toolchain.compile_argv[0], *CPP_FLAGS, "-x", "c++-header", stub,
                         "-o", partial],
                        env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, capture_output=True,
                        timeout=600, check=True,
                    )  # fmt: skip
                    os.chmod(partial, 0o644)
                    os.replace(partial, target)
                finally:
                    if os.path.exists(partial):
                        os.unlink(partial)
        except (OSError, subprocess.SubprocessError):
            _PCH_FAILED.add(folder)
            return False
    return True


def available_languages() -> tuple[Language, ...]:
    """Return the languages whose toolchains are installed here (``require_language`` succeeds)."""
    found = []
    for lang in Language:
        try:
            require_language(lang)
        except LanguageUnavailableError:
            continue
        found.append(lang)
    return tuple(found)


def compile_launcher(toolchain: Toolchain) -> str:
    """Return the trusted Python the compile run executes: compile, then print the framed artifact.

    The compiler's stdout and stderr go to a log file (so that a flood of errors cannot reach
    the run's output limit before the artifact), of which the first ``COMPILER_LOG_BYTES``
    are copied to stderr. Exit 1: the compiler failed; ``COMPILE_TIMEOUT_EXIT``: it was
    killed by its CPU limit.
    """
    return f"""\
import binascii, os, signal, zlib
argv = {list(toolchain.compile_argv)!r}
os.mkdir({OUT_DIR!r})
log = os.open("compile.log", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
    (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)])
_, status = os.waitpid(pid, 0)
os.lseek(log, 0, 0)
text = os.read(log, {COMPILER_LOG_BYTES})
os.write(2, text)
if len(text) == {COMPILER_LOG_BYTES}:
    os.write(2, b"\\n[compiler output truncated]\\n")
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    os.write(2, ("the compiler was killed by " + signal.Signals(sig).name + "\\n").encode())
    os._exit({COMPILE_TIMEOUT_EXIT} if sig in (signal.SIGXCPU, signal.SIGKILL) else 1)
if os.WEXITSTATUS(status) != 0:
    os._exit(1)
packed = bytearray()
for root, dirs, names in os.walk({OUT_DIR!r}):
    dirs.sort()
    for name in sorted(names):
        path = os.path.join(root, name)
        rel = os.path.relpath(path, {OUT_DIR!r}).encode()
        with open(path, "rb") as handle:
            data = handle.read()
        packed += len(rel).to_bytes(2, "little") + rel + len(data).to_bytes(8, "little") + data
frame = {ARTIFACT_PREFIX.encode()!r} + binascii.b2a_base64(zlib.compress(packed, 6))
view = memoryview(frame)
while view:
    view = view[os.write(1, view):]
"""


def run_launcher(toolchain: Toolchain, memory_mb: int) -> str:
    """Return the trusted Python a run executes: unpack the artifact (if compiled), then exec."""
    argv = toolchain.run_command(memory_mb)
    unpack = ""
    if toolchain.compiled:
        unpack = f"""\
import binascii, zlib
with open({ARTIFACT_FILE!r}, "rb") as handle:
    blob = zlib.decompress(binascii.a2b_base64(handle.read()))
os.unlink({ARTIFACT_FILE!r})
at = 0
while at < len(blob):
    size = int.from_bytes(blob[at:at + 2], "little")
    rel = os.path.join({OUT_DIR!r}, blob[at + 2:at + 2 + size].decode())
    at += 2 + size
    size = int.from_bytes(blob[at:at + 8], "little")
    os.makedirs(os.path.dirname(rel), exist_ok=True)
    fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    view = memoryview(blob)[at + 8:at + 8 + size]
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)
    at += 8 + size
del blob, view
"""
    return f"import os\n{unpack}argv = {argv!r}\nos.execv(argv[0], argv)\n"


def artifact_of(stdout: str) -> str | None:
    """Return the artifact text a compile run printed (checked: one framed base64 line), or None."""
    if not stdout.startswith(ARTIFACT_PREFIX):
        return None
    body = stdout[len(ARTIFACT_PREFIX) :].strip()
    if not body or len(body) > ARTIFACT_MAX_BYTES or not body.isascii():
        return None
    allowed = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    return body if set(body) <= allowed else None
