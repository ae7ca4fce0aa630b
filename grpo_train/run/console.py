"""What a run prints: the run's own messages, not the expected chatter of the libraries below it.

``setup_logging(level)`` configures the console for ``grpo train`` / ``grpo eval``. At ``info``
(the default) it drops, by exact message, warnings that are expected on every run and mean
nothing to act on (``EXPECTED_NOISE``):

- vLLM's ``RotaryEmbedding: Failed to load weights`` and ``ParallelLMHead: Failed to load
  weights`` after each in-place weight reload: the rotary embedding has no weights and the tied
  LM head is re-tied by our worker extension (``rollout/vllm_worker.py``). The same warning for
  any other layer still shows: there it means weights were really not loaded.
- Triton probing on a CPU machine, LD_PRELOAD performance hints, and the notes vLLM prints about
  settings we chose on purpose (eager mode, whole prefills).

The filter reaches vLLM's loggers through vLLM's own ``VLLM_LOGGING_CONFIG_PATH`` (a logging
config file naming ``ExpectedNoise``), in this process and in the engine's child processes
(``vllm_in_process: false``, ``grpo serve``) alike. ``debug`` shows everything.

``grpo train`` (``setup_logging(level, details_to_file=True)``) keeps its console to the progress
bar, the summary and what needs the user's attention: at ``info`` the console shows warnings and
errors (without timestamps, printed above the progress bar) and the few notes marked for it
(``CONSOLE``: "resuming from ..."); every record at ``info`` and above, with its time, goes to
the run's ``train.log`` (``attach_run_log``, once the run folder is known; the records logged
before are kept until then). Library chatter such as matplotlib's font-cache note is in the file
only.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

LEVELS = ("debug", "info", "warning", "error")

#: Messages dropped at ``info`` and above: (logger name prefix, message regex, full match).
EXPECTED_NOISE: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Weight reload: layers without loadable weights of their own (see the module doc).
    ("vllm", re.compile(r"(RotaryEmbedding|ParallelLMHead): Failed to load weights")),
    ("vllm", re.compile(r"Triton is installed, but doesn't include CPU backend\. .*")),
    ("vllm", re.compile(r"Triton is installed but 0 active driver\(s\) found .*")),
    ("vllm", re.compile(r"Triton not installed or not compatible; .*")),
    ("vllm", re.compile(r"Triton is not installed\. triton-cpu is expected on x86 CPUs\.")),
    ("vllm", re.compile(r"Model Runner V2 requires Triton; using the V1 model runner instead\.")),
    ("vllm", re.compile(r"lib(tcmalloc|iomp) is not found in LD_PRELOAD\. .*")),
    ("vllm", re.compile(r"Enforce eager set, disabling torch\.compile.*")),
    ("vllm", re.compile(r"Inductor compilation was disabled by user settings.*")),
    ("vllm", re.compile(r"This model does not officially support disabling chunked prefill\..*")),
    # vLLM's CPU worker calling its own guard of torch.set_num_threads (the engine inside a
    # launched rank; grpo-kit's num_threads is restored after start-up), and a cache setting
    # for Mamba-style layers that a model without them never uses.
    (
        "vllm",
        re.compile(
            r"CPU backend doesn't allow to use `torch\.set_num_threads` after the thread "
            r"binding, skip it\."
        ),
    ),
    ("vllm", re.compile(r"Reset SSM cache type to float32 for accelerated GDN mamba .*")),
    # An engine in the trainer's process seeds the global generators; the engine's start gives
    # the trainer its own random state back (rollout/vllm_engine.py, _random_state_kept).
    ("vllm", re.compile(r"The global random seed is set to \d+\. Since VLLM_ENABLE_V1_.*")),
)


#: Messages that belong in the run's log file, not on the console: true, but nothing to act on.
DETAILS_ONLY: tuple[tuple[str, re.Pattern[str]], ...] = (
    # One per weight when the engine runs in bfloat16 for a float32 policy (vllm_dtype: auto on
    # a CPU with bfloat16 instructions): the conversion is the point of that setting.
    (
        "vllm",
        re.compile(
            r"Attempted to load weight \S+ with dtype torch\.float32 into parameter with dtype "
            r"torch\.bfloat16"
        ),
    ),
    # vLLM's CPU linear layers use torch's kernel where oneDNN declines a shape or dtype.
    ("vllm", re.compile(r"Failed to create oneDNN linear, fallback to torch linear\..*", re.S)),
)


def is_details_only(name: str, message: str) -> bool:
    """Return whether a log message goes to the run's log file only (``DETAILS_ONLY``).

    >>> is_details_only("vllm.model_executor.models.utils", "Attempted to load weight "
    ...     "norm.weight with dtype torch.float32 into parameter with dtype torch.bfloat16")
    True
    >>> is_details_only("grpo_train", "Failed to create oneDNN linear, fallback to torch linear.")
    False
    """
    return any(
        name.startswith(prefix) and pattern.fullmatch(message) for prefix, pattern in DETAILS_ONLY
    )


def _to_run_log(record: logging.LogRecord) -> None:
    """Write a details-only record to the command's run log (or its pending records), once."""
    if getattr(record, "grpo_details_written", False):
        return
    record.grpo_details_written = True
    for handler in logging.getLogger().handlers:
        run_log = getattr(handler, "grpo_run_log", False) or isinstance(handler, _PendingRecords)
        if run_log and record.levelno >= handler.level:
            handler.emit(record)


def is_expected_noise(name: str, message: str) -> bool:
    """Return whether a log message is one of ``EXPECTED_NOISE``.

    >>> is_expected_noise("vllm.model_executor", "RotaryEmbedding: Failed to load weights")
    True
    >>> is_expected_noise("vllm.model_executor", "Qwen2MLP: Failed to load weights")
    False
    """
    return any(
        name.startswith(prefix) and pattern.fullmatch(message) for prefix, pattern in EXPECTED_NOISE
    )


#: vLLM's note that one of its engine's processes ended: what that process logs next (input
#: dumps, the fatal error's traceback) is the engine's teardown, and the trainer says in one line
#: what happened (``rollout.processes``). Exit code 0 is a worker that stopped on a signal.
ENGINE_PROCESS_ENDED = re.compile(r"Worker proc \S+ died unexpectedly \(exit code: (-?\d+)\).*")
#: vLLM's shutdown notes (``[shutdown] ...``): after a stop request or an engine failure, which
#: the run reports itself.
SHUTDOWN_NOTE = re.compile(r"\[shutdown\] .*")


class ExpectedNoise(logging.Filter):
    """A logging filter that drops ``EXPECTED_NOISE`` records (used in vLLM's processes too).

    Also, in a vLLM process, the teardown of an engine one of whose processes ended (after
    ``ENGINE_PROCESS_ENDED``, kept when its exit code is not 0) and vLLM's shutdown notes.
    """

    tearing_down = False
    """Set in a process once vLLM said that one of its engine's processes ended."""

    def __init__(self, keep_details: bool = False) -> None:
        super().__init__()
        self.keep_details = keep_details
        """The run log's own filter keeps ``DETAILS_ONLY`` records; a console's sends them there."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record unless it is expected noise (or details, for a console)."""
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        if is_details_only(record.name, message):
            if self.keep_details:
                return True
            _to_run_log(record)
            return False
        if record.name.startswith("vllm"):
            ended = ENGINE_PROCESS_ENDED.fullmatch(message)
            if ended:
                first = not ExpectedNoise.tearing_down
                ExpectedNoise.tearing_down = True
                return first and ended.group(1) != "0"
            if ExpectedNoise.tearing_down or SHUTDOWN_NOTE.fullmatch(message):
                return False
        return not is_expected_noise(record.name, message)


def _vllm_logging_config(level: str) -> str:
    """Write vLLM's default console config plus our filter to a file; return its path."""
    fmt = (
        "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
        "[%(fileinfo)s:%(lineno)d] %(message)s"
    )
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"expected": {"()": f"{__name__}.ExpectedNoise"}},
        "formatters": {
            "vllm": {
                "()": "vllm.logging_utils.NewLineFormatter",
                "datefmt": "%m-%d %H:%M:%S",
                "format": fmt,
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "filters": ["expected"],
                "level": level.upper(),
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level.upper(), "propagate": False}},
    }
    fd, path = tempfile.mkstemp(prefix="grpo-kit-vllm-logging-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    return path


QUIET_ENV = "GRPO_KIT_QUIET"
#: The run's log file in its folder (``grpo train``): every record at the run's level, timed.
RUN_LOG_FILE = "train.log"
#: ``logger.info(..., extra=CONSOLE)``: a note shown on a quiet console too (what the user asked
#: for happened, e.g. the checkpoint a resumed run starts from).
CONSOLE = {"grpo_console": True}
#: Records kept for the run's log file until its folder is known (the oldest are dropped past it).
PENDING_RECORDS = 2000


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The console handler: writes to whatever ``sys.stderr`` is now (a redirect, a capture).

    Lines go through ``tqdm.write``, which prints them above a progress bar instead of through it.
    """

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:  # StreamHandler.__init__ sets it; ignored
        pass

    def emit(self, record: logging.LogRecord) -> None:
        """Write one formatted record to the current stderr, above any progress bar."""
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise into the run
            self.handleError(record)


class _ConsoleThreshold(logging.Filter):
    """Pass records at ``level`` and above, and notes marked ``CONSOLE``."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a record at the threshold or marked for the console."""
        return record.levelno >= self.level or bool(getattr(record, "grpo_console", False))


class _PendingRecords(logging.Handler):
    """Holds the records logged before the run folder exists, for ``attach_run_log``."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: collections.deque[logging.LogRecord] = collections.deque(
            maxlen=PENDING_RECORDS
        )

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record."""
        self.records.append(record)


def attach_run_log(run_dir: str | Path, name: str = RUN_LOG_FILE) -> logging.Handler | None:
    """Send the command's records to ``run_dir/name`` from now on, the pending ones first.

    Only under ``setup_logging(..., details_to_file=True)`` (``grpo train``, ``grpo eval``);
    None otherwise. The file stays open until the command ends (or the next ``setup_logging``
    in this process).
    """
    root = logging.getLogger()
    pending = next((h for h in root.handlers if isinstance(h, _PendingRecords)), None)
    if pending is None:
        return None
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(Path(run_dir) / name, encoding="utf-8")
    handler.setLevel(pending.level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ExpectedNoise(keep_details=True))
    handler.grpo_run_log = True  # type: ignore[attr-defined]  # setup_logging closes it
    for record in pending.records:
        if handler.filter(record):
            handler.emit(record)
    root.removeHandler(pending)
    root.addHandler(handler)
    return handler


def quiet_child_process() -> None:
    """In a process that a quiet ``grpo`` command spawned (vLLM's engine), filter from the start.

    vLLM's engine processes import vLLM, which logs its Triton probing, before vLLM configures
    its logging; those records reach Python's last-resort handler unfiltered. The spawned
    process imports the ``grpo`` entry point's module first (multiprocessing's spawn re-imports
    the main module), which calls this, so the records meet ``ExpectedNoise`` instead.
    """
    if os.environ.get(QUIET_ENV) != "1" or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ExpectedNoise())
    handler.setLevel(logging.WARNING)
    handler.grpo_kit_child = True  # type: ignore[attr-defined]  # setup_logging replaces it
    logging.getLogger().addHandler(handler)


def _no_weight_loading_bars() -> None:
    """Drop transformers' "Loading weights" bar (one per model load); downloads keep theirs."""
    try:
        import huggingface_hub.utils as hub_utils
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    downloads = not hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # also turns the hub's off, which may take minutes:
    if downloads:
        hub_utils.enable_progress_bars()


def setup_logging(level: str = "info", *, details_to_file: bool = False) -> None:
    """Configure the console for a ``grpo`` command at ``level`` (one of ``LEVELS``).

    ``details_to_file`` (``grpo train``): at ``info`` the console shows warnings, errors and
    ``CONSOLE`` notes only, and every record goes to the run's log file once ``attach_run_log``
    names its folder (see the module doc).

    Sets the environment that vLLM (and its child processes, which inherit it) reads when first
    imported, so call this before building an engine.
    """
    if level not in LEVELS:
        raise ValueError(f"log_level: {level!r} is not one of {list(LEVELS)}")
    numeric = getattr(logging, level.upper())
    root = logging.getLogger()
    for handler in list(root.handlers):  # only ours: a test's or an app's handlers stay
        if getattr(handler, "grpo_kit_child", False) or isinstance(
            handler, _StderrHandler | _PendingRecords
        ):
            root.removeHandler(handler)
        elif getattr(handler, "grpo_run_log", False):  # an earlier command's run log
            root.removeHandler(handler)
            handler.close()
    console = _StderrHandler()
    if details_to_file:
        # The time of each line is in the log file; the console line says what and where.
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        console.addFilter(_ConsoleThreshold(logging.WARNING if level == "info" else numeric))
        root.addHandler(_PendingRecords(numeric))
        if level != "debug":
            _no_weight_loading_bars()
    else:
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    root.setLevel(numeric)
    if level == "debug":
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
        return
    os.environ[QUIET_ENV] = "1"  # read by vLLM's engine processes (``quiet_child_process``)
    # torch's C++ warnings of vLLM's CPU worker (NUMA binding) in those processes.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    for handler in root.handlers:
        if not any(isinstance(f, ExpectedNoise) for f in handler.filters):
            handler.addFilter(ExpectedNoise())
    # vLLM logs every engine step at INFO; its warnings stay (minus the expected ones).
    vllm_level = "WARNING" if level == "info" else level.upper()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", vllm_level)
    if "VLLM_LOGGING_CONFIG_PATH" not in os.environ:
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = _vllm_logging_config(vllm_level)
    # Deprecation notices from vLLM's own imports, raised in its engine processes.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning:vllm.triton_utils.dispatcher")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\..*")
    for name in ("httpx", "urllib3", "filelock", "huggingface_hub"):
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
