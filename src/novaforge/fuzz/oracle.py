"""The differential oracle: one fuzz program, compiled with novaforge, against eager.

`check(prog, backend)` builds three instances of the program's module (eager, float64
reference, compiled), then makes three calls (four, see misuse), each on fresh inputs from
`make_inputs`: twice with the same data, once with other data (so a stale constant or a value cached across calls
shows). Every call runs under `torch.no_grad()` and checks, in this order:

* errors: a compile that raises `novaforge.UnsupportedError` is a *refusal* (a clear answer,
  not a failure); any other exception from compiling or running is a *crash*;
* count, dtype and shape of every output;
* values: an exact value (see `program.Meta`: a binary-grid value that every evaluation
  order computes without rounding) must be bit-identical; any other float value must satisfy,
  element by element, |compiled - ref64| <= 8 |eager - ref64| + eps (4 + 2 depth + red)
  (|ref64| + mean |ref64|) + eps (2 + depth) scale, where ref64 is the same program in float64:
  eager's own error is the estimate of how ill-conditioned the value is, the second term allows
  the rounding of a different (fused, reordered) evaluation of the value's depth and reduction
  length in its worst dtype, and the third the absolute rounding of the magnitudes it was
  computed from (`scale`: a log-sum of probabilities is 0 up to the rounding of their sum, 1);
  and, where eager's own error is small by luck on an ill-conditioned value, 8 |jittered -
  ref64|, the largest deviation of three eager runs that move every inexact intermediate value
  by one ulp at random (`program.run_steps(jitter=...)`: cancellation, normalization of nearly
  constant rows and exp of their result show there, whatever the op);
  non-finite values must match eager's class (nan, +inf, -inf);
* aliasing: an output shares storage with an input, or with another output, exactly when
  eager's does (zero-size tensors excluded);
* layout: an output eager returns contiguous is contiguous;
* input mutation: every input afterwards equals eager's (same rule as values);
* repeated calls: the second call leaves the first call's outputs unchanged and returns no
  tensor of the first call;
* misuse (every fourth seed): a fourth call with the first float input in float64, a new
  signature: where eager raises (a float32 Linear given float64) the compiled call must raise,
  else it must match eager like any call.

Returns None (the program passed), or a `Finding` with a kind (refusal, crash, count, dtype,
shape, wrong, alias, layout, mutation, repeat) and a signature used to group findings and to
check, while shrinking, that a smaller program fails the same way.
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass

import torch

from .program import Meta, Program, analyze, instantiate, run_steps, storage_key

BAD = ("count", "dtype", "shape", "wrong", "alias", "layout", "mutation", "repeat", "crash", "no_error")


@dataclass
class Finding:
    kind: str
    detail: str
    signature: str
    call: int = 1
    output: int = -1  # the output the finding is about, if any

    def is_failure(self) -> bool:
        return self.kind != "refusal"


def _where(exc: BaseException) -> str:
    """The innermost novaforge frame of the exception (file:line in function)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/novaforge/" in f.filename
              and "/novaforge/fuzz/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('/novaforge/', 1)[1]}:{f.lineno} in {f.name}"


def _crash(exc: BaseException, call: int, stage: str) -> Finding:
    where = _where(exc)
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    detail = f"{stage} (call {call}): {type(exc).__name__}: {msg}" + (f"\n  at {where}" if where else "")
    return Finding("crash", detail, f"crash:{type(exc).__name__}:{where}", call)


def bound(ref: torch.Tensor, eager: torch.Tensor, meta: Meta, jittered: list[torch.Tensor] = ()) -> torch.Tensor:
    """The allowed |compiled - ref| of each element (see the module docstring)."""
    r = ref.double()
    e = eager.double()
    scale = float(r.abs().mean()) if r.numel() else 0.0
    eps = max(meta.eps, 2.0 ** -24)
    off = (e - r).abs()
    for j in jittered:
        off = torch.maximum(off, torch.nan_to_num((j.double() - r).abs(), nan=0.0, posinf=0.0))
    return (8 * off + eps * (4 + 2 * meta.depth + meta.red) * (r.abs() + scale)
            + eps * (2 + meta.depth) * meta.scale + 1e-30)


def compare_values(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor, meta: Meta,
                   jittered: list[torch.Tensor] = ()) -> str:
    """'' when got is acceptable for eager's `want` (ref: the float64 value), else a description."""
    if got.numel() == 0:
        return ""
    if meta.exact or not (want.is_floating_point() or got.is_floating_point()):
        if meta.exact and want.is_floating_point() and not bool(torch.isfinite(want).all()):
            pass  # fall through to the float comparison (exactness does not cover inf/nan)
        elif torch.equal(got.cpu(), want.cpu()):
            return ""
        elif not want.is_floating_point():
            diff = (got != want).nonzero()
            i = tuple(diff[0].tolist()) if len(diff) else ()
            return f"exact value differs at {list(i)}: {got[i].item()} vs eager {want[i].item()} " \
                   f"({int((got != want).sum())} of {want.numel()} elements)"
    g, w = got.double(), want.double()
    fin = torch.isfinite(w)
    same_class = torch.where(fin, torch.isfinite(g), (torch.isnan(g) & torch.isnan(w)) | (g == w))
    if not bool(same_class.all()):
        i = tuple((~same_class).nonzero()[0].tolist())
        return f"non-finite mismatch at {list(i)}: {g[i].item()} vs eager {w[i].item()}"
    if meta.exact:
        bad = fin & (g != w)
        if bool(bad.any()):
            i = tuple(bad.nonzero()[0].tolist())
            return (f"exact value differs at {list(i)}: {g[i].item()!r} vs eager {w[i].item()!r} "
                    f"({int(bad.sum())} of {w.numel()} elements)")
        return ""
    r = torch.where(torch.isfinite(ref.double()), ref.double(), w)
    b = bound(r, w, meta, [j for j in jittered if j.shape == w.shape and j.is_floating_point()])
    err = (g - r).abs()
    bad = fin & (err > b)
    if bool(bad.any()):
        ratio = torch.where(bad, err / b, torch.zeros_like(err))
        i = tuple(int(x) for x in torch.unravel_index(ratio.argmax(), ratio.shape)) if ratio.dim() else ()
        return (f"value differs at {list(i)}: {g[i].item():.8g} vs eager {w[i].item():.8g} (float64 "
                f"{r[i].item():.8g}; error {err[i].item():.3g} > bound {b[i].item():.3g}; {int(bad.sum())} of "
                f"{w.numel()} elements; depth {meta.depth}, reduction {meta.red}, eps {meta.eps:.2g})")
    return ""


def _alias_pairs(outs: list[torch.Tensor], ins: list[torch.Tensor]) -> tuple[set, set]:
    def key(t):
        return storage_key(t) if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().nbytes() else None

    ik = [key(t) for t in ins]
    ok = [key(t) for t in outs]
    with_inputs = {(i, j) for i, a in enumerate(ok) for j, b in enumerate(ik) if a is not None and a == b}
    between = {(i, j) for i, a in enumerate(ok) for j, b in enumerate(ok) if i < j and a is not None and a == b}
    return with_inputs, between


def _as_list(out) -> list:
    return list(out) if isinstance(out, tuple | list) else [out]


def check(prog: Program, backend: str, options: dict | None = None) -> Finding | None:
    import novaforge

    an = analyze(prog)
    if not an.ok:
        raise ValueError(f"invalid program (seed {prog.seed}): {an.error}")
    cls, make = instantiate(prog)
    cls64, make64 = instantiate(prog, f64=True)
    warnings.filterwarnings("ignore")
    metas_out = [an.meta[o] for o in prog.outputs]
    metas_in = [an.meta.get(i.name, Meta(False, eps=2.0 ** -23)) for i in prog.inputs]
    with torch.no_grad():
        eager, ref64, mod = cls().eval(), cls64().eval(), cls().eval()
        try:
            # (fallback="raise": the fuzzer tests novaforge's own capture, not Dynamo's graph splitting)
            compiled = novaforge.compile(mod, backend=backend, freeze=prog.freeze,
                                         **{"fallback": "raise", **(options or {})})
        except Exception as e:  # noqa: BLE001 - compile() itself only validates its arguments
            return _crash(e, 0, "compile")
        first: list[torch.Tensor] = []
        first_saved: list[torch.Tensor] = []
        jittered: dict[int, list] = {}
        calls = [(1, 0), (2, 0), (3, 1)] + ([(4, 0)] if prog.seed % 4 == 0 else [])
        for call, variant in calls:
            e_in, r_in, c_in = make(variant), make64(variant), make(variant)
            if call == 4:  # misuse: the first float input in float64 (eager may raise: then compiled must)
                e_in, c_in = _retyped(e_in), _retyped(c_in)
                if e_in is None:
                    break
            eager_exc = None
            try:
                e_out = _as_list(eager(*e_in))
            except Exception as e:  # noqa: BLE001 - eager raises on this data: compiled must too
                eager_exc = e
            else:
                r_out, r_in = _reference(ref64, r_in, e_out, e_in)
                if call != 4 and variant not in jittered:  # calls 1 and 2 share their data
                    jittered[variant] = _jittered(prog, cls, make, variant, call)
                jit = jittered[variant] if call != 4 else []
            try:
                c_out = _as_list(compiled(*c_in))
            except novaforge.UnsupportedError as e:
                if eager_exc is not None:
                    continue
                if call == 4:
                    break  # a float64 signature novaforge does not compile: refused, clearly
                if call == 1:
                    return Finding("refusal", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                                   f"refusal:{str(e).split(':')[0][:60]}")
                return _crash(e, call, "run")
            except Exception as e:  # noqa: BLE001 - a crash is a finding
                if eager_exc is not None:
                    continue
                return _crash(e, call, "compile or run" if call == 1 else "run")
            if eager_exc is not None:
                return Finding("no_error", f"eager raises {type(eager_exc).__name__}: {eager_exc} but compiled "
                               "returns a result", "no_error", call)
            f = _compare_call(prog, call, e_in, e_out, r_in, r_out, c_in, c_out, metas_out, metas_in, jit)
            if f is not None:
                return f
            if call == 1:
                first = c_out
                first_saved = [t.clone() for t in c_out]
            elif call == 2:
                f = _compare_repeat(first, first_saved, c_out)
                if f is not None:
                    return f
    return None


def _retyped(inputs: list) -> list | None:
    """The inputs with the first float32/bfloat16 one in float64 (None when there is none)."""
    for i, t in enumerate(inputs):
        if t.dtype in (torch.float32, torch.bfloat16):
            return inputs[:i] + [t.double()] + inputs[i + 1:]
    return None


def _jittered(prog: Program, cls, make, variant: int, call: int, runs: int = 3) -> list[list[torch.Tensor]]:
    """The outputs of `runs` eager runs with every inexact intermediate moved by one ulp at random
    (fresh module and inputs each; a run that fails or turns non-finite is left out)."""
    out = []
    for k in range(runs):
        gen = torch.Generator().manual_seed(prog.seed * 7 + call * 3 + k)
        try:
            with torch.no_grad():
                a = run_steps(prog, cls().eval(), make(variant), jitter=gen)
        except Exception:  # noqa: BLE001 - an estimate only
            continue
        if a.ok:
            out.append([a.values[o] for o in prog.outputs])
    return out


def _reference(ref64, r_in: list, e_out: list, e_in: list) -> tuple[list, list]:
    """The float64 run's outputs and inputs where it has eager's shapes (float64 can change type
    promotion, e.g. a 0-d float64 tensor against an int-derived float32 one, or make an op
    reject its operands); eager's own values where it does not (the bound then rests on eps)."""
    try:
        r_out = _as_list(ref64(*r_in))
    except Exception:  # noqa: BLE001 - the float64 program is not eager's program
        return list(e_out), list(e_in)
    if len(r_out) != len(e_out):
        return list(e_out), list(e_in)
    outs = [r if isinstance(r, torch.Tensor) and r.shape == e.shape else e for r, e in zip(r_out, e_out, strict=True)]
    ins = [r if r.shape == e.shape else e for r, e in zip(r_in, e_in, strict=True)]
    return outs, ins


def _compare_call(prog, call, e_in, e_out, r_in, r_out, c_in, c_out, metas_out, metas_in, jit) -> Finding | None:
    if len(c_out) != len(e_out):
        return Finding("count", f"{len(c_out)} outputs, eager {len(e_out)}", "count", call)
    for i, (c, e) in enumerate(zip(c_out, e_out, strict=True)):
        if not isinstance(c, torch.Tensor):
            return Finding("count", f"output {i} is {type(c).__name__}", "count", call, i)
        if c.dtype != e.dtype:
            return Finding("dtype", f"output {i} ({prog.outputs[i]}): {c.dtype}, eager {e.dtype}", "dtype", call, i)
        if c.shape != e.shape:
            return Finding("shape", f"output {i} ({prog.outputs[i]}): {list(c.shape)}, eager {list(e.shape)}",
                           "shape", call, i)
    for i, (c, e, r) in enumerate(zip(c_out, e_out, r_out, strict=True)):
        msg = compare_values(c, e, r, metas_out[i], [run[i] for run in jit])
        if msg:
            return Finding("wrong", f"output {i} ({prog.outputs[i]}, {e.dtype}{list(e.shape)}): {msg}", "wrong",
                           call, i)
    for j, (c, e, r) in enumerate(zip(c_in, e_in, r_in, strict=True)):
        msg = compare_values(c, e, r, metas_in[j])
        if msg:
            return Finding("mutation", f"input {prog.inputs[j].name} after the call: {msg}", "mutation", call)
    ea, eb = _alias_pairs(e_out, e_in)
    ca, cb = _alias_pairs(c_out, c_in)
    if ca != ea:
        extra, missing = sorted(ca - ea), sorted(ea - ca)
        what = "; ".join([f"output {i} ({prog.outputs[i]}) aliases input {prog.inputs[j].name}, eager's does not"
                          for i, j in extra] +
                         [f"output {i} ({prog.outputs[i]}) does not alias input {prog.inputs[j].name}, eager's does"
                          for i, j in missing])
        return Finding("alias", what, "alias:" + ("extra" if extra else "missing"), call, (extra or missing)[0][0])
    if cb != eb:
        extra, missing = sorted(cb - eb), sorted(eb - cb)
        what = "; ".join([f"outputs {i} and {j} share storage, eager's do not" for i, j in extra] +
                         [f"outputs {i} and {j} do not share storage, eager's do" for i, j in missing])
        return Finding("alias", what, "alias:outputs-" + ("extra" if extra else "missing"), call,
                       (extra or missing)[0][0])
    for i, (c, e) in enumerate(zip(c_out, e_out, strict=True)):
        if e.is_contiguous() and not c.is_contiguous():
            return Finding("layout", f"output {i} ({prog.outputs[i]}) is not contiguous (strides {c.stride()}), "
                           "eager's is", "layout", call, i)
    return None


def _compare_repeat(first: list[torch.Tensor], saved: list[torch.Tensor], second: list[torch.Tensor]) -> Finding | None:
    for i, (t, s) in enumerate(zip(first, saved, strict=True)):
        if t.shape != s.shape or not torch.equal(torch.nan_to_num(t), torch.nan_to_num(s)):
            return Finding("repeat", f"call 2 changed output {i} of call 1", "repeat:overwritten", 2, i)
    keys1 = {storage_key(t) for t in first if t.numel() and t.untyped_storage().nbytes()}
    for i, t in enumerate(second):
        if t.numel() and t.untyped_storage().nbytes() and storage_key(t) in keys1:
            return Finding("repeat", f"call 2's output {i} shares storage with an output of call 1",
                           "repeat:shared", 2, i)
    return None


def same_failure(a: Finding | None, b: Finding) -> bool:
    """Does finding a reproduce b (for shrinking)?"""
    if a is None:
        return False
    if b.kind == "wrong":
        return a.kind == "wrong"
    return a.signature == b.signature


