"""Which sandbox the code environments of a process score on: the local one, or remote services.

By default every code environment runs its programs in this machine's sandbox
(``grpo_envs.code.scoring.shared_sandbox``). ``use_remote_sandbox(settings)`` switches the whole
process to ``sandbox.remote.RemoteSandbox`` services instead, without any environment knowing
who asked: the trainer's setup does it from its ``sandbox`` config section, ``grpo eval`` and
``grpo envs score`` from the same flags (``add_sandbox_arguments``). An environment given its
own ``sandbox=`` keeps it.

``check_sandbox_backend`` fails early, with the fix, where the choice cannot work: function-style
tasks (``CallTest``: HumanEval, MBPP) on a plain SandboxFusion, which cannot judge them outside
the candidate's process.
"""

from __future__ import annotations

import argparse
import itertools
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from grpo_envs.base import Environment
    from sandbox.remote import RemoteSettings

#: Where code runs: ``local`` (this machine's sandbox) or ``remote`` (``sandbox_urls``).
SandboxBackend = Literal["local", "remote"]
BACKENDS: tuple[str, ...] = ("local", "remote")
#: Samples of a split whose tasks ``check_sandbox_backend`` builds to learn their test kind.
PROBE_SAMPLES = 32

_REMOTE: RemoteSettings | None = None
_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork stays held forever in the child.
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def use_remote_sandbox(settings: RemoteSettings | None) -> None:
    """Score this process's code environments on remote services (``None``: the local sandbox).

    The token (``settings.token_env``) is read now, so that a missing one fails at start-up.
    """
    from sandbox.remote import RemoteSettings

    global _REMOTE
    if settings is not None:
        if not isinstance(settings, RemoteSettings):
            raise TypeError(f"expected RemoteSettings or None, got {type(settings).__name__}")
        settings.token()
    with _LOCK:
        _REMOTE = settings


def remote_sandbox_settings() -> RemoteSettings | None:
    """Return the remote services this process scores on (``None``: the local sandbox)."""
    with _LOCK:
        return _REMOTE


def remote_settings(
    backend: str,
    urls: str | Iterable[str] = "",
    *,
    protocol: str = "grpo",
    token_env: str = "",
    max_in_flight: int = 64,
    retries: int = 3,
    request_timeout_s: float | None = None,
) -> RemoteSettings | None:
    """Build the settings a command line or config asks for (``None`` for ``local``).

    ``ValueError`` with the fix: an unknown backend, ``remote`` without URLs, a bad URL, an
    unknown protocol, or URLs given to ``local`` (surely a forgotten ``--sandbox_backend``).

    >>> remote_settings("local") is None
    True
    >>> remote_settings("remote", "http://a:8080,http://b:8080").urls
    ('http://a:8080', 'http://b:8080')
    >>> try:
    ...     remote_settings("remote")
    ... except ValueError as exc:
    ...     print(str(exc).split(":")[0])
    sandbox_backend remote needs sandbox_urls
    """
    from sandbox.remote import RemoteSettings

    listed = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls)]
    listed = [u for u in listed if u]
    if backend not in BACKENDS:
        raise ValueError(f"sandbox_backend {backend!r} is not one of {list(BACKENDS)}")
    if backend == "local":
        if listed:
            raise ValueError(
                "sandbox_urls is given but sandbox_backend is local: add sandbox_backend remote "
                "to score on those services, or drop sandbox_urls"
            )
        return None
    if not listed:
        raise ValueError(
            "sandbox_backend remote needs sandbox_urls: the services' base URLs, "
            "comma-separated, e.g. http://sandbox-a:8080,http://sandbox-b:8080"
        )
    try:
        return RemoteSettings(
            urls=tuple(listed),
            protocol=protocol,  # type: ignore[arg-type]  # checked by RemoteSettings
            token_env=token_env,
            max_in_flight=max_in_flight,
            retries=retries,
            request_timeout_s=request_timeout_s,
        )
    except ValueError as exc:  # name the flags, not the dataclass
        raise ValueError(str(exc).replace("RemoteSettings.", "sandbox_")) from None


def check_sandbox_backend(envs: Iterable[Environment], split: str = "train") -> None:
    """Refuse function-style code tasks on a plain SandboxFusion, naming the fix (``ValueError``).

    Looks at the tasks of the first ``PROBE_SAMPLES`` samples of ``split`` of each code
    environment (others are skipped): a plain SandboxFusion cannot judge ``CallTest``s outside
    the candidate's process, so their items would all end ``sandbox_error``.
    """
    settings = remote_sandbox_settings()
    if settings is None or settings.protocol != "sandbox_fusion":
        return
    from grpo_envs.types import Sample
    from sandbox import CallTest

    for env in envs:
        inner = env.unwrapped
        # A code environment (``scoring.CodeEnvironment``, which imports this module): its
        # ``task`` builds a sample's trusted tests.
        make_task = getattr(inner, "task", None)
        if not callable(make_task) or split not in inner.splits:
            continue
        for row in itertools.islice(inner.dataset(split), PROBE_SAMPLES):
            try:
                task = make_task(Sample.from_row(row))
            except (ValueError, TypeError, KeyError):
                continue  # a malformed sample is its own item's error
            tests = getattr(task, "tests", ())
            if tests and isinstance(tests[0], CallTest):
                name = inner.env_id or type(inner).__name__
                raise ValueError(
                    f"{name} has function-call tests (CallTest), which a plain SandboxFusion "
                    "(sandbox_protocol sandbox_fusion) cannot judge outside the candidate's "
                    "process: serve them with `grpo sandbox serve` on the sandbox machines and "
                    "set sandbox_protocol grpo"
                )


def add_sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``--sandbox_*`` flags (the trainer's ``sandbox`` config section's names)."""
    group = parser.add_argument_group("sandbox (where code runs)")
    group.add_argument(
        "--sandbox_backend",
        choices=BACKENDS,
        default="local",
        help="local: this machine's sandbox; remote: the services at --sandbox_urls",
    )
    group.add_argument(
        "--sandbox_urls", default="", help="comma-separated base URLs, e.g. http://a:8080"
    )
    group.add_argument(
        "--sandbox_protocol",
        choices=("grpo", "sandbox_fusion"),
        default="grpo",
        help="grpo: `grpo sandbox serve`; sandbox_fusion: a plain SandboxFusion (stdin/stdout "
        "tasks only)",
    )
    group.add_argument(
        "--sandbox_token_env",
        default="",
        help="NAME of the environment variable holding the bearer token",
    )
    group.add_argument(
        "--sandbox_max_in_flight", type=int, default=64, help="requests in flight at once"
    )
    group.add_argument(
        "--sandbox_retries", type=int, default=3, help="tries after the first for one request"
    )
    group.add_argument(
        "--sandbox_request_timeout_s",
        type=float,
        default=0.0,
        help="deadline of one request; 0: the job's own time limits plus 10 s",
    )


def sandbox_settings_from(args: argparse.Namespace) -> RemoteSettings | None:
    """``remote_settings`` from the flags ``add_sandbox_arguments`` added."""
    return remote_settings(
        args.sandbox_backend,
        args.sandbox_urls,
        protocol=args.sandbox_protocol,
        token_env=args.sandbox_token_env,
        max_in_flight=args.sandbox_max_in_flight,
        retries=args.sandbox_retries,
        request_timeout_s=args.sandbox_request_timeout_s or None,
    )
