"""Topic logs, the dump directory and the compile progress line, configured in one place.

* **Logs** (`NOVAFORGE_LOGS`, like `TORCH_LOGS`): one `logging` logger per topic,
  `novaforge.<topic>` for the topics in `TOPICS`. `NOVAFORGE_LOGS=passes,fusion` shows those
  topics at INFO level, `+passes` at DEBUG, `all` / `+all` every topic. Named topics get a
  handler writing `[novaforge.<topic>] message` to the current `sys.stderr` and stop
  propagating; the others are left to the application's own `logging` configuration
  (level unset, propagating). Modules log through `get_logger(topic)` and never configure.
* **Dump** (`NOVAFORGE_DUMP=dir`): every compile gets a fresh folder `dir/<NNN>-<name>/` with
  the IR after every pass (`passes/`), every generated source (`cpu/`, `triton/`) and an
  `index.txt` describing each file; `dir/index.txt` lists the compiles.
* **Progress**: a compile shows `novaforge: <name>: <stage> ... 2.3 s` on one terminal line
  once it has run for `PROGRESS_DELAY_S`, erased when it ends; nothing when stderr is not a TTY
  or `NOVAFORGE_PROGRESS=0`.

Invariant: `configure()` is idempotent and cheap (it re-applies only when `NOVAFORGE_LOGS`
changed); with no variable set nothing here writes anything or starts a thread. Every
environment variable is read through `settings`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import settings

TOPICS = ("capture", "passes", "fusion", "schedule", "codegen", "cache", "runtime", "dynamo", "refine")
PROGRESS_DELAY_S = 1.0


def get_logger(topic: str) -> logging.Logger:
    if topic not in TOPICS:
        raise ValueError(f"unknown log topic {topic!r}; topics: {', '.join(TOPICS)}")
    return logging.getLogger(f"novaforge.{topic}")


# ---------------------------------------------------------------------------------- logs
class _StderrHandler(logging.Handler):
    """Writes to whatever `sys.stderr` is at the time of the record (pytest's capture too)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never break a compile
            self.handleError(record)


_HANDLER = _StderrHandler()
_HANDLER.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
_applied: list[str | None] = [None]
_config_lock = threading.Lock()


def parse_spec(spec: str) -> dict[str, int]:
    """`"passes,+fusion"` -> {"passes": INFO, "fusion": DEBUG}; raises ValueError naming
    NOVAFORGE_LOGS on an unknown topic."""
    levels: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        level = logging.DEBUG if item.startswith("+") else logging.INFO
        name = item.lstrip("+-").strip()
        names = TOPICS if name == "all" else (name,)
        for n in names:
            if n not in TOPICS:
                raise ValueError(f"NOVAFORGE_LOGS={spec!r}: unknown topic {n!r}; expected a comma-separated list "
                                 f"of {', '.join(TOPICS)} or all, each optionally prefixed with + (debug level)")
            levels[n] = min(levels.get(n, level), level)
    return levels


def configure(spec: str | None = None) -> dict[str, int]:
    """Apply `spec` (default `$NOVAFORGE_LOGS`) to the topic loggers; returns the levels set."""
    spec = settings.logs_spec() if spec is None else spec
    levels = parse_spec(spec)
    with _config_lock:
        if _applied[0] == spec:
            return levels
        for topic in TOPICS:
            lg = logging.getLogger(f"novaforge.{topic}")
            if topic in levels:
                lg.setLevel(levels[topic])
                if _HANDLER not in lg.handlers:
                    lg.addHandler(_HANDLER)
                lg.propagate = False
            elif _HANDLER in lg.handlers:
                lg.removeHandler(_HANDLER)
                lg.setLevel(logging.NOTSET)
                lg.propagate = True
        _applied[0] = spec
    return levels


# ---------------------------------------------------------------------------------- dump
_dump_lock = threading.Lock()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "graph"


class DumpDir:
    """The dump folder of one compile; `write` adds a file and its index line."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.entries: list[tuple[str, str]] = []  # (relative path, what it is)

    def write(self, rel: str, text: str, what: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        self.entries.append((rel, what))
        return p

    def copy_tree(self, src: Path, rel: str, what: str) -> None:
        """Copy every file of `src` (generated sources kept by a cache entry) under `rel/`."""
        if not src.is_dir():
            return
        for f in sorted(src.iterdir()):
            if f.is_file():
                self.write(f"{rel}/{f.name}", f.read_text(errors="replace"), f"{what}: {f.name}")

    def finish(self, summary: str) -> None:
        """Write `index.txt` (every file under the folder, described) and the top-level index line."""
        known = dict(self.entries)
        lines = [f"# {self.name}: {summary}"]
        for p in sorted(self.path.rglob("*")):
            if p.is_file() and p.name != "index.txt":
                rel = p.relative_to(self.path).as_posix()
                what = known.get(rel) or ("generated Triton source" if rel.startswith("triton/") else "file")
                lines.append(f"{rel}\t{what}")
        (self.path / "index.txt").write_text("\n".join(lines) + "\n")
        with _dump_lock, open(self.path.parent / "index.txt", "a") as f:
            f.write(f"{self.path.name}/\t{summary}\n")


def open_dump(name: str) -> DumpDir | None:
    """A new folder under $NOVAFORGE_DUMP for one compile (None when dumping is off)."""
    root = settings.dump_dir()
    if not root:
        return None
    base = Path(root).expanduser()
    base.mkdir(parents=True, exist_ok=True)
    with _dump_lock:
        i = len([p for p in base.iterdir() if p.is_dir()])
        while True:
            path = base / f"{i:03d}-{_safe(name)}"
            try:
                path.mkdir()
                break
            except FileExistsError:
                i += 1
    return DumpDir(path, name)


# ------------------------------------------------------------------------------ progress
class Progress:
    """One terminal line `novaforge: <name>: <stage> ... <elapsed>`, redrawn by a daemon thread
    after `delay` seconds, erased at `close()`. Inactive (no thread) unless `enabled`."""

    def __init__(self, name: str, enabled: bool, delay: float = PROGRESS_DELAY_S, stream: Any = None) -> None:
        self.name = name
        self.stream = stream
        self.t0 = time.perf_counter()
        self.delay = delay
        self.text = "starting"
        self.shown = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled:
            self._thread = threading.Thread(target=self._loop, name="novaforge-progress", daemon=True)
            self._thread.start()

    def stage(self, text: str) -> None:
        self.text = text

    def _out(self) -> Any:
        return self.stream or sys.stderr

    def _loop(self) -> None:
        if self._stop.wait(self.delay):
            return
        while True:
            line = f"novaforge: {self.name}: {self.text} ... {time.perf_counter() - self.t0:.1f} s"
            with contextlib.suppress(Exception):
                self._out().write("\r" + line[:150] + "\x1b[K")
                self._out().flush()
                self.shown = True
            if self._stop.wait(0.2):
                return

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self.shown:
            with contextlib.suppress(Exception):
                self._out().write("\r\x1b[K")
                self._out().flush()


def progress_wanted() -> bool:
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and settings.progress_enabled()


# ------------------------------------------------------------------------------- session
class CompileSession:
    """What one compile reports to: its progress line and its dump folder (either may be off)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.progress = Progress(name, progress_wanted())
        self.dump = open_dump(name)

    def stage(self, text: str) -> None:
        self.progress.stage(text)


_session: contextvars.ContextVar[CompileSession | None] = contextvars.ContextVar("novaforge_session", default=None)


def current() -> CompileSession | None:
    """The compile session of this thread's running compile (None outside one)."""
    return _session.get()


def stage(text: str) -> None:
    s = _session.get()
    if s is not None:
        s.stage(text)


@contextlib.contextmanager
def compile_session(name: str) -> Iterator[CompileSession]:
    """Configure the logs, open the progress line and the dump folder for one compile."""
    configure()
    session = CompileSession(name)
    token = _session.set(session)
    try:
        yield session
    finally:
        _session.reset(token)
        session.progress.close()
