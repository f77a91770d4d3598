"""Loading rendered Triton sources as Python modules; source files and debug dumps.

Invariant: a source text is written once, atomically (temp file + rename), to a file named by
the sha256 of the text and the execution mode, in a user-only directory
(`$NOVAFORGE_CACHE_DIR/triton-src`, default `~/.cache/novaforge/triton-src`); it is imported
under a unique module name and its `kernel` JIT function is kept in memory under the same
digest, so equal sources share one module and one Triton binary. A file whose text differs from
what we meant to write is rewritten, never trusted. Triton caches compiled binaries itself,
keyed by the source. Interpreter and GPU modes never mix in one process: `ensure_mode` checks
that the imported Triton runs in the mode the program needs and says how to fix it otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ... import settings
from ...options import Options

_loaded: dict[str, Any] = {}


def cache_root() -> Path:
    return settings.cache_root()


def source_dir() -> Path:
    d = cache_root() / "triton-src"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def dump_dir(options: Options | dict[str, Any] | None = None) -> Path | None:
    """Where generated sources are copied for inspection: the dump_dir option, or
    $NOVAFORGE_DEBUG (a directory; '1' means ./novaforge_debug); None when neither is set."""
    d = Options.of(options).dump_dir or settings.debug_dir()
    if not d or d == "0":
        return None
    path = Path("novaforge_debug" if d == "1" else d) / "triton"
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(source: str, interpret: bool) -> str:
    return hashlib.sha256((("interpret\n" if interpret else "cuda\n") + source).encode()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def triton_interprets() -> bool:
    """Whether the imported Triton runs kernels in its CPU interpreter. Triton decides this when
    its standard library is decorated, at import: TRITON_INTERPRET=1 must be set before anything
    imports triton (torch.export does). If triton is not imported yet, importing it here follows
    the current environment."""
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


def ensure_mode(interpret: bool) -> None:
    if "triton" not in sys.modules and interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if triton_interprets() != interpret:
        if interpret:
            raise RuntimeError("the triton backend runs CPU graphs in Triton's interpreter, but triton was "
                               "imported without it: set TRITON_INTERPRET=1 before anything imports triton "
                               "(e.g. in the environment of the process)")
        raise RuntimeError("triton was imported in interpreter mode (TRITON_INTERPRET=1), so it cannot "
                           "compile kernels for the GPU in this process")


def load_kernel(source: str, interpret: bool) -> Any:
    """The `kernel` JIT function defined by `source` (imported once per process)."""
    h = digest(source, interpret)
    fn = _loaded.get(h)
    if fn is not None:
        return fn
    path = source_dir() / f"nf_{h[:24]}.py"
    try:  # any bytes in the file (another encoding, truncation): compared as bytes, rewritten
        ok = path.read_bytes() == source.encode()
    except OSError:
        ok = False
    if not ok:
        _write_atomic(path, source)
    name = f"novaforge_triton_{h[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load generated kernel {path}")
    ensure_mode(interpret)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = mod.kernel
    _loaded[h] = fn
    return fn


def dump_source(directory: Path, title: str, source: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in title)[:60]
    path = directory / f"{safe}_{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
    if not path.exists():
        _write_atomic(path, source)
    return path
