"""Compiler options: one typed, validated object passed down explicitly.

`novaforge.compile(model, **options)` and `torch.compile(model, backend="novaforge",
options={...})` turn their keyword options into one `Options` (`Options.of`), which rejects an
unknown name (naming the valid ones) and a value of the wrong kind before anything compiles.
The same object goes to the pipeline (`PassContext.options`), every pass, the backend's
`build` and the numerics checker; they read its typed fields. docs/options.md documents each
field (a test checks that every field is documented there).

Environment variables are not options: they are read in settings.py, at the point of use.

Invariant: an `Options` is immutable and valid; `replace` returns a new validated one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

CAPTURES = ("fx", "export")
CHECKS = ("0", "1", "numerics")
FALLBACKS = ("eager", "raise")
MATMUL_LOADERS = ("pointer", "tma", "auto")
MATMUL_EXECUTORS = ("triton", "torch")
GENERATE_CACHES = ("static", "dynamic")
RANDOM_MODES = ("counter", "eager")


@dataclass(frozen=True)
class Options:
    # -- capture and passes
    capture: str = "fx"  # "fx" (make_fx over functional_call) or "export" (torch.export)
    graph_cache: bool = True  # reuse captured graphs across compiles (frontend/graph_cache.py)
    fold_max_elements: int = 1 << 26  # constant folding skips larger results
    inplace: bool = True  # a pointwise result may reuse a dying input's buffer; a mutated input is updated in its own
    keep_graphs: bool = False  # every pass record keeps its graph
    check: str | None = None  # None: $NOVAFORGE_CHECK decides; "0" off; "1" verifier; "numerics" also kernels
    pass_fuel: Mapping[int, int] = field(default_factory=dict)  # pass position -> decisions it may take
    pass_trace: bool = False  # pass records keep a description of every decision
    random: str = "counter"  # dropout/bernoulli/rand: "counter" (generated SplitMix64) or "eager" (ATen's exact draws)
    memory_budget: float = 1.0  # training: share of the forward-to-backward bytes kept (the rest recomputed; remat.py)
    compile_only: bool = False  # build without data (set by CompiledModule.compile_only)
    generate_cache: str = "static"  # CompiledModule.generate: "static" (bucketed static KV cache) or "dynamic"
    decode_loop: bool = True  # CompiledModule.generate: novaforge's decode loop where it applies (decode_loop.py)
    backend: str = "auto"  # the backend (the torch.compile entry point takes it as an option)
    fallback: str = "eager"  # a graph novaforge cannot compile runs eagerly (torch.compile) or through Dynamo
    # (novaforge.compile: what one traced graph cannot hold, docs/semantics.md), or "raise"
    symbolic_programs: bool = True  # dynamic graphs: one program for every size (backends that build them: cpu, triton)
    tiered: bool = True  # dynamic graphs: a new size runs eagerly until its calls cost one build (runtime/tiering.py)
    static_parts: bool = True  # torch.compile, dynamic graphs: that eager run uses compiled static parts
    overlap_collectives: bool = True  # issue torch.distributed collectives early, wait late (overlap_collectives.py)
    # -- CPU backend
    pack_weights: bool = False  # keep packed copies of constant matmul weights
    profile: bool = False  # time every launch
    refine: bool = False  # measure kernels while running, try other schedules for slow ones (codegen/cpu/refine.py)
    refine_sample_every: int = 8  # refine: every n-th call is timed (and, while trying, run by an alternative)
    # -- Triton backend
    tf32: bool | None = None  # None: TF32 unless torch.get_float32_matmul_precision() is "highest" (as eager)
    cuda_graphs: bool = True
    dump_dir: str = ""  # copy generated Triton sources there (also $NOVAFORGE_DEBUG)
    matmul_loader: str = "pointer"
    matmul_executor: str = "triton"
    matmul_persistent: str | bool | None = "auto"  # "auto", "on"/True, "off"/False
    matmul_tf32_round: bool = False  # TF32 matmuls: round operands to nearest (cvt.rna) before the dot
    parallel_compile: bool = True
    compile_threads: int | None = None  # default: min(16, CPU count)
    max_reduction_block: int | None = None  # test knob: cap a reduction's column block
    reduction_outer_tile: int = 0  # Triton, experimental: reductions over an outer axis in [N, N] tiles (0: off)
    split_reductions: bool = True  # Triton: a long sum with few outputs runs as two sums (passes/split_reductions.py)
    matmul_tile: tuple[int, int] | None = None  # test knob: force (BLOCK_M, BLOCK_N)
    matmul_programs: int | None = None  # test knob: a persistent grid of this many programs
    matmul_subtile: int | None = None  # test knob: epilogue subtiles

    def __post_init__(self) -> None:
        _choice("capture", self.capture, CAPTURES)
        _choice("fallback", self.fallback, FALLBACKS)
        _choice("matmul_loader", self.matmul_loader, MATMUL_LOADERS)
        _choice("matmul_executor", self.matmul_executor, MATMUL_EXECUTORS)
        _choice("generate_cache", self.generate_cache, GENERATE_CACHES)
        _choice("random", self.random, RANDOM_MODES)
        if isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int | float) \
                or not 0.0 <= self.memory_budget <= 1.0:
            raise ValueError(f"option memory_budget={self.memory_budget!r}; expected a number in [0, 1]")
        if isinstance(self.refine_sample_every, int) and self.refine_sample_every < 1:
            raise ValueError(f"option refine_sample_every={self.refine_sample_every!r}; expected an int >= 1")
        if self.matmul_persistent not in ("auto", "on", "off", True, False, None):
            raise ValueError(f"option matmul_persistent={self.matmul_persistent!r}; expected 'auto', 'on' or 'off'")
        if self.check is not None:  # normalized: None (unset, "" too), "0", "1" or "numerics"
            c = {"": None, 0: "0", 1: "1"}.get(self.check, self.check)  # (False == 0, True == 1)
            if c is not None and c not in CHECKS:
                raise ValueError(f"option check={self.check!r}; expected '0', '1' or 'numerics'")
            object.__setattr__(self, "check", c)
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "bool" and not isinstance(v, bool | int):
                raise TypeError(f"option {f.name}={v!r} must be a bool")
            if f.type in ("int", "int | None") and v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"option {f.name}={v!r} must be an int")
        object.__setattr__(self, "pass_fuel", dict(self.pass_fuel or {}))

    def use_tf32(self) -> bool:
        """Float32 matmuls and attention on TF32 tensor cores: the option, or where it is None,
        what eager's CUDA matmuls do now (torch.set_float32_matmul_precision "high"/"medium")."""
        if self.tf32 is not None:
            return bool(self.tf32)
        import torch

        return torch.get_float32_matmul_precision() != "highest"

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, options: Options | Mapping[str, Any] | None = None, **more: Any) -> Options:
        """`options` (an Options, a dict of option names, or None) plus `more`, validated."""
        if isinstance(options, Options):
            return options.replace(**more) if more else options
        given = {**dict(options or {}), **more}
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"valid options: {', '.join(cls.names())} (docs/options.md)")
        return cls(**given)

    def replace(self, **changes: Any) -> Options:
        return Options.of({**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # a read-only mapping view, so that `{**options, "backend": b}` and `dict(options)` give the
    # option dict (readers use the typed fields; there is deliberately no `get`)
    def keys(self) -> list[str]:
        return self.names()

    def __getitem__(self, name: str) -> Any:
        if name not in self.names():
            raise KeyError(name)
        return getattr(self, name)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults (what a user set)."""
        default = Options()
        return {k: v for k, v in self.as_dict().items() if getattr(default, k) != v}


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"option {name}={value!r}; expected one of {', '.join(map(repr, allowed))}")


__all__ = ["Options"]
