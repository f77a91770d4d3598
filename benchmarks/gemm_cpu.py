"""float32 GEMM on this CPU: novaforge's nf_gemm against the vendor libraries, same run, interleaved.

Invariant: every candidate computes the same C[M, N] = A[M, K] @ W^T for the same inputs (checked
against a float64 reference before timing), runs with the same thread count, and is timed in
interleaved rounds (shuffled order, a pause between candidates so that spinning worker threads of
the previous library go idle); the reported figure is the median over rounds, the spread is the
interquartile range over rounds. Nothing is cached between candidates except their own prepared
weights (packing/reorder happens before timing, as a compiler does at compile time).

    python benchmarks/gemm_cpu.py                   # full table (~12 min)
    python benchmarks/gemm_cpu.py --quick           # M in {128, 1024}, 3 rounds
    python benchmarks/gemm_cpu.py --json out.json   # also write all samples

Candidates (those whose package is missing are skipped):
  torch.mm      torch.mm(A, W^T, out=C)                     (MKL sgemm)
  mkl-packed    torch.ops.mkl._mkl_linear with the weight from _mkl_reorder_linear_weight:
                what torch.compile + freezing runs for fp32 linears (static batch)
  onednn        torch.ops.mkldnn._linear_pointwise with _reorder_linear_weight (oneDNN)
  openblas      numpy.matmul(A, W^T, out=C)                 (numpy's OpenBLAS)
  ort           ONNX Runtime, one MatMul with a constant weight (MLAS prepacks it), IOBinding
  openvino      OpenVINO, one MatMul with a constant weight, f32 precision hint, LATENCY hint
  nf            nf_sgemm_packed (weights packed by nf_sgemm_pack_b), called through ctypes
  nf-nt         nf_sgemm_nt: the dot-product kernel reading W [N, K] in place (no packed copy)
  nf-unpacked   nf_sgemm on B = W^T (stride_k 1): W packed on the fly inside every call (transposed)
  nf-kn         nf_sgemm on the weight stored [K, N] row-major (GPT-2's Conv1D): packed on the fly

    python benchmarks/gemm_cpu.py --dtype bf16 --m 128 --kn 768x2304,768x768,768x3072,3072x768 --no-bmm
                  adds the bf16 candidates below (bf16 copies of the same inputs, checked against the
                  float64 reference at bf16's tolerance) next to float32 nf; the last column gives each
                  one's time relative to float32 nf (packed) in the same run:
  torch-bf16    torch.mm on bf16 (oneDNN: AMX / AVX512-BF16 where present)
  onednn-bf16   torch.ops.mkldnn._linear_pointwise with the bf16 weight reordered ahead
  nf-bf16       nf_gemm_bf16_vnni_packed (weights in VNNI panels), on the CPU's best bf16 path
  nf-bf16-nt    nf_gemm_nt_mixed, bf16 W [N, K] read in place (packed on the fly into VNNI panels)
  nf-bf16-kn    nf_gemm_mixed, bf16 weight stored [K, N] (GPT-2's Conv1D)
  nf-bf16-avx512  nf-bf16 forced onto the AVX512-BF16 kernel (VDPBF16PS)
  nf-bf16-convert nf_gemm_nt_mixed forced onto the float32-conversion path (the former bf16 route)

    python benchmarks/gemm_cpu.py --only nf,nf-nt,nf-unpacked --threads 1 --clock process --m 128,1024
    --rotate R    R different weight matrices per shape, each call uses the next one (R x 7 MB > L3:
                  weights come from DRAM as in a real forward; every candidate prepares R copies)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

THREADS_DEFAULT = 2


def _threads_from_argv(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
        if arg == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
    return THREADS_DEFAULT


# thread pools read these when the libraries load, so they are set before numpy/torch are imported
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(_threads_from_argv(sys.argv[1:]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from novaforge.codegen.cpu import gemm  # noqa: E402
from novaforge.codegen.cpu.gemm import build, ops  # noqa: E402

KN = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 2048), (2048, 768), (768, 32000)]
MS = [1, 16, 128, 1024]
# GPT-2 (12 layers, hidden 768): per layer qkv, attention out-projection, MLP up, MLP down
GPT2_LAYER = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]


def build_candidates(threads: int) -> dict[str, Callable]:
    """name -> prepare(a, w) returning a zero-argument call that writes/returns C."""
    cands: dict[str, Callable] = {}

    def torch_mm(a, w):
        wt, c = w.t(), torch.empty(a.shape[0], w.shape[0])
        return lambda: torch.mm(a, wt, out=c)

    cands["torch.mm"] = torch_mm

    if torch._C.has_mkl:

        def mkl_packed(a, w):
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w, a.shape[0])
            return lambda: torch.ops.mkl._mkl_linear(a, packed, w, None, a.shape[0])

        cands["mkl-packed"] = mkl_packed

    if torch.backends.mkldnn.is_available():

        def onednn(a, w):
            packed = torch.ops.mkldnn._reorder_linear_weight(w, a.shape[0])
            return lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")

        cands["onednn"] = onednn

    def openblas(a, w):
        an, wtn = a.numpy(), w.numpy().T
        c = np.empty((a.shape[0], w.shape[0]), dtype=np.float32)
        return lambda: np.matmul(an, wtn, out=c)

    cands["openblas"] = openblas

    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        def onnxruntime(a, w):
            M, K = a.shape
            N = w.shape[0]
            wt = numpy_helper.from_array(np.ascontiguousarray(w.numpy().T), "w")
            graph = helper.make_graph(
                [helper.make_node("MatMul", ["x", "w"], ["y"])],
                "mm",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
                [wt],
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            x = ort.OrtValue.ortvalue_from_numpy(a.numpy())
            y = ort.OrtValue.ortvalue_from_shape_and_type([M, N], np.float32)
            binding = sess.io_binding()
            binding.bind_ortvalue_input("x", x)
            binding.bind_ortvalue_output("y", y)
            return lambda: (sess.run_with_iobinding(binding), y)[1]

        assert onnx  # imported for the model builder
        cands["ort"] = onnxruntime
    except ImportError:
        pass

    try:
        import openvino as ov
        import openvino.opset13 as ovops

        core = ov.Core()

        def openvino(a, w):
            M, K = a.shape
            x = ovops.parameter([M, K], ov.Type.f32, name="x")
            y = ovops.matmul(x, ovops.constant(np.ascontiguousarray(w.numpy().T)), False, False)
            model = ov.Model([y], [x], "mm")
            config = {
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": "f32",
            }
            req = core.compile_model(model, "CPU", config).create_infer_request()
            req.set_input_tensor(ov.Tensor(a.numpy(), shared_memory=True))
            return lambda: (req.infer(), req.get_output_tensor(0))[1]

        cands["openvino"] = openvino
    except ImportError:
        pass

    lib = ops.lib()

    def nf(a, w):
        M, K = a.shape
        N = w.shape[0]
        pb = gemm.pack_b(w.t())
        c = torch.empty(M, N)
        fn, args = lib.nf_sgemm_packed, (M, N, K, a.data_ptr(), K, 1, pb.ptr(), c.data_ptr(), N, 0, None, threads)
        return lambda: (fn(*args), c, pb)[1]

    cands["nf"] = nf

    def nf_nt(a, w):
        M, K = a.shape
        N = w.shape[0]
        c = torch.empty(M, N)
        fn, args = lib.nf_sgemm_nt, (M, N, K, a.data_ptr(), K, 1, w.data_ptr(), K, c.data_ptr(), N, 0, None, threads)
        return lambda: (fn(*args), c, w)[1]

    cands["nf-nt"] = nf_nt

    def nf_unpacked(a, w):
        M, K = a.shape
        N = w.shape[0]
        c = torch.empty(M, N)
        fn = lib.nf_sgemm
        args = (M, N, K, a.data_ptr(), K, 1, w.data_ptr(), 1, K, c.data_ptr(), N, 0, None, threads)
        return lambda: (fn(*args), c, w)[1]

    cands["nf-unpacked"] = nf_unpacked

    def nf_kn(a, w):  # the weight stored [K, N] row-major (a Conv1D / x @ W weight, as GPT-2's)
        M, K = a.shape
        N = w.shape[0]
        wkn, c = w.t().contiguous(), torch.empty(M, N)
        fn = lib.nf_sgemm
        args = (M, N, K, a.data_ptr(), K, 1, wkn.data_ptr(), N, 1, c.data_ptr(), N, 0, None, threads)
        return lambda: (fn(*args), c, wkn)[1]

    cands["nf-kn"] = nf_kn
    return cands


BF16_PATH = {"convert": 0, "avx512_bf16": 1, "amx": 2}


def bf16_candidates(threads: int) -> dict[str, Callable]:
    """bf16 products; prepare(a, w) receives the float32 inputs and rounds them to bf16 itself."""
    cands: dict[str, Callable] = {}
    lib = ops.lib()

    def torch_bf16(a, w):
        a16, wt = a.bfloat16(), w.bfloat16().t()
        c = torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16)
        return lambda: torch.mm(a16, wt, out=c)

    cands["torch-bf16"] = torch_bf16
    if torch.backends.mkldnn.is_available():

        def onednn_bf16(a, w):
            a16 = a.bfloat16()
            packed = torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), a.shape[0])
            return lambda: torch.ops.mkldnn._linear_pointwise(a16, packed, None, "none", [], "")

        cands["onednn-bf16"] = onednn_bf16

    def forced(path: str, fn: Callable, args: tuple) -> Callable:
        code = BF16_PATH[path]

        def call():
            lib.nf_gemm_set_bf16_path(code)
            try:
                fn(*args)
            finally:
                lib.nf_gemm_set_bf16_path(-1)

        return call

    def packed(path: str | None):
        def prepare(a, w):
            M, K = a.shape
            N = w.shape[0]
            a16 = a.bfloat16()
            pb = gemm.pack_b_vnni(w.bfloat16().t())
            c = torch.empty(M, N)
            fn = lib.nf_gemm_bf16_vnni_packed
            args = (M, N, K, a16.data_ptr(), K, 1, pb.ptr(), c.data_ptr(), N, 0, None, threads)
            call = forced(path, fn, args) if path else (lambda: fn(*args))
            return lambda: (call(), c, a16, pb)[1]

        return prepare

    def in_place(kn: bool, path: str | None):
        def prepare(a, w):
            M, K = a.shape
            N = w.shape[0]
            a16, w16 = a.bfloat16(), (w.t().contiguous() if kn else w).bfloat16()
            c = torch.empty(M, N)
            if kn:
                fn = lib.nf_gemm_mixed
                args = (M, N, K, a16.data_ptr(), 1, K, 1, w16.data_ptr(), 1, N, 1, c.data_ptr(), N, 0, None, threads)
            else:
                fn = lib.nf_gemm_nt_mixed
                args = (M, N, K, a16.data_ptr(), 1, K, 1, w16.data_ptr(), 1, K, c.data_ptr(), N, 0, None, threads)
            call = forced(path, fn, args) if path else (lambda: fn(*args))
            return lambda: (call(), c, a16, w16)[1]

        return prepare

    cands["nf-bf16"] = packed(None)
    cands["nf-bf16-nt"] = in_place(False, None)
    cands["nf-bf16-kn"] = in_place(True, None)
    cands["nf-bf16-avx512"] = packed("avx512_bf16")
    cands["nf-bf16-convert"] = in_place(False, "convert")
    return cands


def as_tensor(r) -> torch.Tensor:
    if isinstance(r, torch.Tensor):
        return r
    if hasattr(r, "numpy"):  # onnxruntime OrtValue
        r = r.numpy()
    elif hasattr(r, "data") and not isinstance(r, np.ndarray):  # openvino Tensor
        r = r.data
    return torch.from_numpy(np.asarray(r))


def check(name: str, call: Callable, a: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> None:
    out = as_tensor(call())
    err = (out.double() - ref).abs()
    tol = 1e-6 * (1 + a.shape[1] ** 0.5) * scale + 1e-5
    if "bf16" in name:  # inputs rounded to bf16 (2^-9 relative each), output maybe too
        tol = 1.2e-2 * scale + 1e-3
    if (err > tol).any():
        raise AssertionError(f"{name}: wrong result (max err {err.max().item():.3g})")


CLOCK: Callable[[], float] = time.perf_counter
CENTER: Callable[[list[float]], float] = statistics.median


def time_burst(call: Callable, target_s: float) -> float:
    """Seconds per call over a burst of calls lasting about target_s (first call not timed); with
    --stat best, the fastest single call of the burst instead of the burst's mean."""
    call()
    t0 = CLOCK()
    call()
    one = CLOCK() - t0
    n = max(1, min(200, int(target_s / max(one, 1e-6))))
    if CENTER is min:
        best = float("inf")
        for _ in range(n):
            t0 = CLOCK()
            call()
            best = min(best, CLOCK() - t0)
        return best
    t0 = CLOCK()
    for _ in range(n):
        call()
    return (CLOCK() - t0) / n


def rotating(calls: list[Callable]) -> Callable:
    """One call that runs the next of `calls` each time (weights rotating through memory)."""
    if len(calls) == 1:
        return calls[0]
    state = [0]

    def call():
        i = state[0]
        state[0] = (i + 1) % len(calls)
        return calls[i]()

    return call


def bench_shape(M: int, K: int, N: int, cands: dict, rounds: int, burst_s: float, pause_s: float,
                rotate: int = 1) -> dict:
    gen = torch.Generator().manual_seed(M * 7 + K * 13 + N)
    a = torch.randn(M, K, generator=gen)
    ws = [torch.randn(N, K, generator=gen) / K**0.5 for _ in range(rotate)]
    w = ws[0]
    ref = a.double() @ w.double().t()
    scale = a.double().abs() @ w.double().abs().t()
    calls = {}
    for name, prepare in cands.items():
        try:
            first = prepare(a, w)
            check(name, first, a, w, ref, scale)
            calls[name] = rotating([first] + [prepare(a, x) for x in ws[1:]])
        except (RuntimeError, AssertionError) as e:
            print(f"  [{name} skipped for {M}x{K}x{N}: {str(e).splitlines()[0][:100]}]", file=sys.stderr)
            calls.pop(name, None)
    samples: dict[str, list[float]] = {n: [] for n in calls}
    order = list(calls)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            time.sleep(pause_s)
            samples[name].append(time_burst(calls[name], burst_s))
    del calls
    return samples


# attention-like batched products per forward of one GPT-2 layer: (heads*batch) x [128 x 64] @ [64 x 128]
# (scores, B = K^T through strides) and [128 x 128] @ [128 x 64] (probabilities @ V)
BMM = [("q @ k^T", 64, 128, True), ("p @ v", 128, 64, False)]


def bench_bmm(batch: int, threads: int, rounds: int, burst_s: float, pause_s: float) -> list[str]:
    lines = []
    lib = ops.lib()
    for label, K, N, transposed in BMM:
        gen = torch.Generator().manual_seed(K + N)
        a = torch.randn(batch, 128, K, generator=gen)
        b = torch.randn(batch, N, K, generator=gen).transpose(1, 2) if transposed else torch.randn(batch, K, N)
        c1, c2 = torch.empty(batch, 128, N), torch.empty(batch, 128, N)
        args = (batch, 128, N, K, a.data_ptr(), a.stride(0), a.stride(1), a.stride(2), b.data_ptr(), b.stride(0),
                b.stride(1), b.stride(2), c2.data_ptr(), c2.stride(0), c2.stride(1), 0, None, threads)
        calls = {"torch.bmm": lambda: torch.bmm(a, b, out=c1), "nf": lambda: lib.nf_sgemm_batched(*args)}
        calls["torch.bmm"](), calls["nf"]()
        torch.testing.assert_close(c2, c1, rtol=1e-4, atol=1e-4)
        samples: dict[str, list[float]] = {n: [] for n in calls}
        order = list(calls)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                time.sleep(pause_s)
                samples[name].append(time_burst(calls[name], burst_s))
        flops = 2.0 * batch * 128 * N * K
        med = {n: CENTER(x) for n, x in samples.items()}
        lines.append(f"| {label}: {batch} x 128 x {K} x {N} | " + " | ".join(
            f"{flops / med[n] / 1e9:.1f}" for n in calls) + f" | {med['torch.bmm'] / med['nf']:.2f} |")
    return lines


def bench_epilogue(threads: int, rounds: int, burst_s: float, pause_s: float) -> list[str]:
    """GPT-2 MLP up-projection with bias + GELU(tanh), and out-projection + bias + residual add."""
    lines = []
    lib = ops.lib()
    cases = [("fc1 + bias + gelu_tanh", 768, 3072, "gelu_tanh"), ("proj + bias + residual", 3072, 768, None)]
    for label, K, N, act in cases:
        gen = torch.Generator().manual_seed(K * N)
        x, w, b = torch.randn(128, K, generator=gen), torch.randn(N, K, generator=gen) / K**0.5, torch.randn(N)
        r = torch.randn(128, N, generator=gen)
        mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(w, 128) if torch._C.has_mkl else None
        dnn_w = torch.ops.mkldnn._reorder_linear_weight(w, 128)
        pb, c = gemm.pack_b(w.t()), torch.empty(128, N)
        ep = build.Epilogue()
        ep.bias, ep.act = b.data_ptr(), build.ACTS[act] if act else 0
        if act is None:
            ep.residual, ep.ld_residual = r.data_ptr(), N
        nf_args = (128, N, K, x.data_ptr(), K, 1, pb.ptr(), c.data_ptr(), N, 0, ctypes.byref(ep), threads)
        gelu = torch.nn.functional.gelu
        calls: dict[str, Callable] = {}
        if act:
            if mkl_w is not None:
                calls["mkl-packed + torch gelu"] = lambda: gelu(
                    torch.ops.mkl._mkl_linear(x, mkl_w, w, b, 128), approximate="tanh")
            calls["onednn fused gelu"] = lambda: torch.ops.mkldnn._linear_pointwise(x, dnn_w, b, "gelu", [], "tanh")
            ref = gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
        else:
            if mkl_w is not None:
                calls["mkl-packed + torch add"] = lambda: torch.ops.mkl._mkl_linear(x, mkl_w, w, b, 128).add_(r)
            calls["onednn + torch add"] = lambda: torch.ops.mkldnn._linear_pointwise(
                x, dnn_w, b, "none", [], "").add_(r)
            ref = x.double() @ w.double().t() + b.double() + r.double()
        calls["nf fused"] = lambda: (lib.nf_sgemm_packed(*nf_args), c)[1]
        for name, call in calls.items():
            err = (call().double() - ref).abs().max().item()
            if err > 1e-3:
                raise AssertionError(f"{label} / {name}: max err {err}")
        samples: dict[str, list[float]] = {n: [] for n in calls}
        order = list(calls)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                time.sleep(pause_s)
                samples[name].append(time_burst(calls[name], burst_s))
        lines.append(f"| {label} (128 x {K} x {N}) | " + ", ".join(
            f"{n} {CENTER(v) * 1e3:.3f}" for n, v in samples.items()) + " |")
    return lines


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--burst", type=float, default=0.05, help="seconds per timed burst")
    p.add_argument(
        "--pause",
        type=float,
        default=0.3,
        help="seconds of sleep before each burst (OpenBLAS's and ORT's idle workers spin ~0.1 s and slow the next "
        "candidate down by up to 60x on 2 cores when this is 0; 0.3 s measured enough)",
    )
    p.add_argument("--quick", action="store_true", help="M in {128, 1024}, 3 rounds")
    p.add_argument("--m", type=str, default=None, help="comma-separated M values")
    p.add_argument("--only", type=str, default=None, help="comma-separated candidate names")
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--no-bmm", action="store_true", help="skip the batched attention-like products")
    p.add_argument("--rotate", type=int, default=1, help="weight matrices per shape, used in turn (see above)")
    p.add_argument("--kn", type=str, default=None, help="K x N shapes, e.g. 768x2304,3072x768 (default: all)")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="bf16: add the bf16 candidates (see above) to float32 nf / nf-nt")
    p.add_argument(
        "--clock",
        choices=["wall", "process"],
        default="wall",
        help="process: CPU seconds of the whole process (only meaningful with --threads 1, on a busy machine)",
    )
    p.add_argument(
        "--stat",
        choices=["median", "best"],
        default="median",
        help="best: fastest single call over all rounds (estimates the undisturbed time on a busy machine)",
    )
    args = p.parse_args(argv)
    global CLOCK, CENTER
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    CENTER = min if args.stat == "best" else statistics.median
    torch.set_num_threads(args.threads)
    ms = [int(x) for x in args.m.split(",")] if args.m else ([128, 1024] if args.quick else MS)
    rounds = 3 if args.quick else args.rounds
    cands = build_candidates(args.threads)
    if args.dtype == "bf16":
        cands = {k: v for k, v in cands.items() if k in ("nf", "nf-nt", "torch.mm")} | bf16_candidates(args.threads)
    if args.only:
        cands = {k: v for k, v in cands.items() if k in args.only.split(",")}
    random.seed(0)

    if args.dtype == "bf16":
        print(f"# bf16: nf_gemm's bf16 path {gemm.bf16_path()} (hardware {gemm.bf16_hw_path()})")
    print(
        f"# float32 GEMM, {args.threads} threads, {rounds} rounds x {args.burst}s bursts, {args.clock} clock, "
        f"{args.stat} GFLOP/s [IQR]"
    )
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, nf isa {gemm.isa()}, "
          f"blocking {gemm.blocking()}, load avg {os.getloadavg()[0]:.1f}")
    names = list(cands)
    print("| M x K x N | " + " | ".join(names) + " | nf / best peer; time vs nf (packed) |")
    print("|---|" + "---|" * (len(names) + 1))
    results = []
    kns = [tuple(int(v) for v in x.split("x")) for x in args.kn.split(",")] if args.kn else KN
    for M in ms:
        for K, N in kns:
            samples = bench_shape(M, K, N, cands, rounds, args.burst, args.pause, args.rotate)
            flops = 2.0 * M * N * K
            med = {n: CENTER(s) for n, s in samples.items()}
            cells = []
            for n in names:
                if n not in samples:
                    cells.append("–")
                    continue
                q1, _, q3 = quartiles(samples[n])
                m = CENTER(samples[n])
                cells.append(f"{flops / m / 1e9:.1f} [{flops / q3 / 1e9:.0f}-{flops / q1 / 1e9:.0f}]")
            peers = {n: t for n, t in med.items() if not n.startswith("nf") and "bf16" not in n}
            best = min(peers, key=peers.get) if peers else None
            ratio = f"{peers[best] / med['nf']:.2f} (vs {best})" if best and "nf" in med else "–"
            # time relative to the float32 packed kernel, same run
            for other in ("nf-nt", "nf-unpacked", "nf-kn", *(n for n in names if "bf16" in n)):
                if other in med and "nf" in med:
                    ratio += f"; {other} {med[other] / med['nf']:.3f}x"
            print(f"| {M} x {K} x {N} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
            results.append({"M": M, "K": K, "N": N, "seconds": samples})

    print()
    for M in ms:  # GPT-2 matmul time per forward (12 layers) from the figures above
        per = {n: 0.0 for n in names}
        ok = True
        for K, N in GPT2_LAYER:
            r = next((x for x in results if (x["M"], x["K"], x["N"]) == (M, K, N)), None)
            if r is None:
                ok = False
                break
            for n in names:
                per[n] += 12 * CENTER(r["seconds"].get(n, [float("nan")]))
        if ok:
            txt = ", ".join(f"{n} {per[n] * 1e3:.1f}" for n in names)
            print(f"GPT-2 linear layers, M={M} tokens: ms per forward: {txt}")
    if not args.no_bmm:
        print("\n| batched (attention), GFLOP/s | torch.bmm | nf | nf / torch |\n|---|---|---|---|")
        for batch in sorted({12 * (1 if m <= 128 else 8) for m in ms}):
            for line in bench_bmm(batch, args.threads, rounds, args.burst, args.pause):
                print(line, flush=True)
    if 128 in ms and not args.no_bmm:
        print("\n| linear with its epilogue, ms per call (median) | candidates |\n|---|---|")
        for line in bench_epilogue(args.threads, rounds, args.burst, args.pause):
            print(line, flush=True)
    print(f"# load avg at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": rounds, "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
