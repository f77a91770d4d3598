"""The eager contract (docs/semantics.md), as checks shared by every backend's tests: a compiled
call returns the same values as eager, fresh tensors where eager's are fresh, the same aliases
where eager's results alias an input or each other, mutates inputs as eager does, sees
reassigned and updated parameters, and raises where eager raises."""

from __future__ import annotations

import contextlib
import copy
import threading
from unittest import mock

import pytest
import torch

import novaforge


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _strides(t: torch.Tensor) -> tuple:
    """Strides, where they mean something (a size-1 dimension's stride is never used)."""
    return tuple(st if n > 1 else 0 for n, st in zip(t.shape, t.stride(), strict=True))


def _aliases(outs, args) -> list[tuple]:
    """For each output: the input or earlier output whose storage it shares, with its layout."""
    found = []
    for i, o in enumerate(outs):
        hit = None
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.numel() and o.numel() and _storage(o) == _storage(a):
                hit = ("in", j, tuple(o.shape), _strides(o), o.storage_offset(), o is a)
        for j, p in enumerate(outs[:i]):
            if hit is None and o.numel() and p.numel() and _storage(o) == _storage(p):
                hit = ("out", j, tuple(o.shape), _strides(o), o.storage_offset(), o is p)
        found.append(hit)
    return found


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


ALIAS_CASES = {
    "clone": lambda x: x.clone(),
    "add_zero": lambda x: x + 0,
    "mul_one": lambda x: x * 1,
    "where_same": lambda x: torch.where(x > 0, x, x),
    "tanh_twice": lambda x: (torch.tanh(x), torch.tanh(x)),
    "transpose_contiguous": lambda x: x.t().contiguous(),
    "view": lambda x: x.view(-1),
    "transpose_view": lambda x: x.t(),
    "select_row": lambda x: x[1],
    "identity": lambda x: x,
    "result_and_view_of_it": lambda x: (lambda y: (y, y.view(-1)))(x * 2),
    "same_result_twice": lambda x: (lambda y: (y, y))(x.exp()),
    "input_and_fresh": lambda x: (x, x + 1),
    # a view returned before its base, and views of a result that eager lays out transposed
    "one_view_twice_around_its_base": lambda x: (lambda y: (lambda z: (z, y, z))(y.view(-1)))(x.sum() * 2),
    # eager's size-1 dim keeps the slice's stride (96), novaforge's is contiguous (48): same layout
    "flattened_size_one_slice": lambda x: (lambda v: (v.flatten(0), v))(x.repeat(1, 1, 2, 1)[-1:1:2]),
    "view_before_its_base": lambda x: (lambda y: (y[1], y.chunk(2, 1)[-1], y))(x * 2),
    # views of an intermediate that is not returned: the program returns it as a hidden leaf
    "views_of_an_unreturned_result": lambda x: (lambda y: (y[0], y[1:]))(x * 2),
    "view_of_a_view_of_an_unreturned_result": lambda x: (lambda v: (v[2], v))(x.mean(0)[1:]),
    "transposed_views_of_an_unreturned_result": lambda x: (lambda y: (y.t()[1], y[:, 2:]))(x.exp()),
}


def check_views_of_an_unreturned_result_in_a_mutating_function(backend: str) -> None:
    """The function also mutates an input (its graph is functionalized, where views lose their
    base): the views still share the hidden base's storage, and the input is updated."""
    def fn(x, y):
        v = x != 0
        y.fill_(1)
        return v.narrow(0, 1, 2), v.select(0, 2)

    x, y = torch.randn(4, 5), torch.randn(3)
    y2 = y.clone()
    want = fn(x, y)
    got = novaforge.compile(fn, backend=backend)(x, y2)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert _aliases(got, (x, y2)) == _aliases(want, (x, y))
    torch.testing.assert_close(y2, y)

    def later_base(x, y):  # the base is not the arena's first buffer (fuzz seed 805659 read another's bytes)
        v = (x != 0).sum(0)
        y.fill_(1)
        return v[-2:], v[:-1]

    x = torch.tensor([[1.0, 0.0, 2.0], [3.0, 4.0, 0.0], [0.0, 5.0, 6.0]])
    y, y2 = torch.randn(3), torch.randn(3)
    want = later_base(x, y)
    got = novaforge.compile(later_base, backend=backend)(x, y2)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w), (g, w)
    assert _aliases(got, (x, y2)) == _aliases(want, (x, y))

    def empty_views(x):  # zero-size views, one updated in place (fuzz seed 606890): no hidden base
        v = torch.stack([x, x], 2).narrow(2, 2, 0)
        return v.sigmoid_(), v.flatten(2)

    x = torch.randn(1, 8, 1)
    for g, w in zip(novaforge.compile(empty_views, backend=backend)(x), empty_views(x), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype


def check_views_of_a_transposed_result(backend: str) -> None:
    """Eager lays `y` out transposed (it follows its input's strides) and returns views of it;
    the program's `y` may be laid out otherwise, but the views must still share its storage and
    see the same elements."""
    def fn(x):
        y = torch.minimum(torch.ones(1), x.t())
        return y.chunk(3, 0)[-1], y, y[:, 2:]

    x = torch.randn(4, 6)
    got = novaforge.compile(fn, backend=backend)(x)
    for g, w in zip(got, fn(x), strict=True):
        torch.testing.assert_close(g, w)
    assert {_storage(g) for g in got} == {_storage(got[1])}
    got[1].fill_(7.0)
    assert bool((got[0] == 7).all()) and bool((got[2] == 7).all())


def check_contiguous_view_of_a_transposed_result(backend: str) -> None:
    """A view that is contiguous only in eager's transposed layout of its base (fuzz seed
    503288): a row of the program's base would not be, so the base comes back laid out as
    eager's, shared with the view, both contiguous or not exactly as eager's."""
    def fn(x):
        y = x.transpose(1, 0).to(torch.float32)
        return y.select(1, -8), y

    x = (torch.randint(-24, 25, (17, 16, 7)) / 8).to(torch.bfloat16)
    want = fn(x)
    got = novaforge.compile(fn, backend=backend)(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride() and g.is_contiguous() == w.is_contiguous()
    assert _aliases(got, (x,)) == _aliases(want, (x,))
    got[1].fill_(3.0)
    assert bool((got[0] == 3).all())


STRIDED_INPUT_RESULTS = {
    "transpose_contiguous": lambda x: (x.transpose(-1, -2).contiguous(),),
    "repeat": lambda x: (x.repeat(2, 1, 1),),
    "expand_contiguous": lambda x: (x[:1].expand(3, 3, 4).contiguous(),),
    "clone": lambda x: (x.clone(),),
    "transpose_view": lambda x: (x.transpose(-1, -2),),
}


def check_results_of_a_strided_input(backend: str) -> None:
    """Results computed only by views of a strided input (fuzz seed 910314: the Triton program
    returned `x.transpose(..).contiguous()` as a transposed view of its own contiguous copy of
    x): fresh and contiguous where eager's are, a view of the caller's x where eager's is."""
    for name, fn in STRIDED_INPUT_RESULTS.items():
        x = torch.randn(3, 3, 8)[..., ::2]
        want = fn(x)
        got = novaforge.compile(fn, backend=backend)(x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
            assert g.is_contiguous() == w.is_contiguous(), (name, g.stride(), w.stride())
        assert _aliases(got, (x,)) == _aliases(want, (x,)), name


def check_aliasing(name: str, backend: str) -> None:
    fn = ALIAS_CASES[name]
    x = torch.randn(4, 6)
    want = _tuple(fn(x))
    got = _tuple(novaforge.compile(fn, backend=backend)(x))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
        assert g.is_contiguous() or not w.is_contiguous(), "eager's result is contiguous"
    assert _aliases(got, (x,)) == _aliases(want, (x,))


def check_constant_output_not_shared(backend: str) -> None:
    c = novaforge.compile(lambda x: (x * 2, torch.ones(4) + 0), backend=backend)
    x = torch.randn(3)
    c(x)[1].add_(100)
    assert torch.equal(c(x)[1], torch.ones(4))


def check_input_mutation(backend: str) -> None:
    def fn(x, y):
        x.add_(1)
        y[0] = 5.0
        return x * 2

    x, y = torch.randn(3, 4), torch.randn(4)
    xe, ye = x.clone(), y.clone()
    out = novaforge.compile(fn, backend=backend)(x, y)
    want = fn(xe, ye)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x, xe)
    torch.testing.assert_close(y, ye)


def check_result_read_before_a_later_mutation(backend: str) -> None:
    """A result equal to the input's old value (where(m, x, x) is x), then x mutated in place:
    the result keeps the old value (the in-place update must not write over what it returns)."""
    def fn(x, m):
        v = torch.where(m, x, x).reshape(3, 1)
        x.neg_()
        return v

    x, m = torch.randn(3), torch.tensor([True, False, True])
    xe = x.clone()
    got, want = novaforge.compile(fn, backend=backend)(x, m), fn(xe, m)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, xe)


def check_mutated_input_then_contiguous(backend: str) -> None:
    """`x.neg_().contiguous()`: the input itself where x is contiguous, a fresh tensor where it
    is strided (the functionalized trace must not make the strided case look like the first)."""
    def fn(x):
        return x.neg_().contiguous()

    for x in (torch.randn(5, 3), torch.randn(5, 6)[:, ::2]):
        xe = (torch.empty(5, 3) if x.is_contiguous() else torch.empty(5, 6)[:, ::2]).copy_(x)
        got, want = novaforge.compile(fn, backend=backend)(x), fn(xe)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, xe)
        assert (got is x) == (want is xe)
        assert (_storage(got) == _storage(x)) == (_storage(want) == _storage(xe))


def check_expanded_input_mutation(backend: str) -> None:
    """fill_ on an expanded (stride-0) input: eager writes its one element; so must the call."""
    def fn(x):
        x.fill_(3.0)
        return x * 2

    base, base_e = torch.zeros(1), torch.zeros(1)
    out = novaforge.compile(fn, backend=backend)(base.expand(4))
    torch.testing.assert_close(out, fn(base_e.expand(4)))
    torch.testing.assert_close(base, base_e)
    # a partial write: eager's value depends on its order of writes; refused, never guessed
    base = torch.ones(1)
    with pytest.raises(novaforge.UnsupportedError, match="expanded"):
        novaforge.compile(lambda x: x[1:].zero_() * 1, backend=backend)(base.expand(4))


def check_inputs_sharing_memory(backend: str) -> None:
    """One tensor passed as two inputs of a function that mutates the first: eager's second name
    sees the write; the compiled call must too, and a later call with distinct tensors must still
    mutate its own first input."""
    def fn(x, y):
        x.mul_(2)
        return y * 3

    c = novaforge.compile(fn, backend=backend)
    t, te = torch.ones(4), torch.ones(4)
    torch.testing.assert_close(c(t, t), fn(te, te))
    torch.testing.assert_close(t, te)
    a, b, ae, be = torch.ones(4), torch.ones(4), torch.ones(4), torch.ones(4)
    torch.testing.assert_close(c(a, b), fn(ae, be))
    torch.testing.assert_close(a, ae)

    def reads_twice(x, y, z):  # mutates x only; y and z may share memory (labels=input_ids)
        x.add_(y * z)
        return y + z

    c = novaforge.compile(reads_twice, backend=backend)
    x, xe, y = torch.ones(4), torch.ones(4), torch.arange(4.0)
    with mock.patch.object(type(c), "_eager", side_effect=AssertionError("ran eagerly")):
        torch.testing.assert_close(c(x, y, y), reads_twice(xe, y, y))
    torch.testing.assert_close(x, xe)


def check_zero_size_operand_errors(backend: str) -> None:
    """Zero-size products keep eager's errors and results: a float64 input to a float32 Linear
    raises even with no rows; einsum over an empty contraction, which eager accepts in mixed
    dtypes, either matches eager or is refused clearly."""
    lin = torch.nn.Linear(7, 3)
    c = novaforge.compile(lin, backend=backend)
    with torch.no_grad():
        x = torch.randn(0, 7, dtype=torch.float64)
        with pytest.raises(RuntimeError):
            lin(x)
        with pytest.raises(RuntimeError):
            c(x)

    def ein(a, b):
        return torch.einsum("...ij,ik->...jk", a, b)

    a, b = torch.randn(0, 8, dtype=torch.float64), torch.randn(0, 4)
    want = ein(a, b)
    try:
        got = novaforge.compile(ein, backend=backend)(a, b)
    except novaforge.UnsupportedError as e:
        assert "could not capture" in str(e)
    else:
        torch.testing.assert_close(got, want)

    # a batched matmul of a zero-size float64 and a float32 operand: eager runs it (by a route
    # whose result dtype the trace cannot see), the mm its decomposition folds to would raise:
    # matched, or refused clearly, never eager's error where eager has none
    def bmm(x, w):
        return torch.matmul(torch.stack([x, x], 0), w)

    x, w = torch.randn(0, 4, dtype=torch.float64), torch.randn(1, 4, 8)
    want = bmm(x, w)
    try:
        got = novaforge.compile(bmm, backend=backend)(x, w)
    except novaforge.UnsupportedError as e:
        assert "another route" in str(e)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape


def check_parameters_seen(backend: str, freeze: bool) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    c = novaforge.compile(lin, backend=backend, freeze=freeze)
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(c(x), lin(x))
        lin.weight = torch.nn.Parameter(torch.randn(3, 5))  # reassigned
        torch.testing.assert_close(c(x), lin(x))
        lin.weight.data = torch.randn(3, 5)  # new storage
        torch.testing.assert_close(c(x), lin(x))
        lin.bias.add_(1.0)  # in place
        torch.testing.assert_close(c(x), lin(x))
        lin.weight = torch.nn.Parameter(torch.randn(3, 5).t().contiguous().t())  # another layout
        torch.testing.assert_close(c(x), lin(x))


def check_inference_mode(backend: str, freeze: bool, pack_weights: bool) -> None:
    """Under torch.inference_mode(): a module built there (its state inference tensors, which keep
    no version counter) and one built outside both compile and run, and an in-place change made
    inside inference mode is seen even by a frozen, weight-packing program."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(24, 16)
            self.register_buffer("scale", torch.rand(16))

        def forward(self, x):
            return self.lin(x) * self.scale + torch.arange(16.0)

    torch.manual_seed(0)
    x = torch.randn(8, 24)
    options = {"pack_weights": True} if pack_weights else {}
    for built_inside in (False, True):
        if built_inside:
            with torch.inference_mode():
                m = Scaled()
        else:
            m = Scaled()
        c = novaforge.compile(m, backend=backend, freeze=freeze, **options)
        with torch.inference_mode():
            torch.testing.assert_close(c(x), m(x))
            if built_inside:  # (outside inference mode, a parameter cannot be changed in place there)
                m.lin.weight.mul_(2.0)
                m.scale.add_(1.0)
                torch.testing.assert_close(c(x), m(x))


def check_copies(backend: str, freeze: bool) -> None:
    """copy.deepcopy of a compiled module (an EMA or teacher copy) and torch.save / torch.load of
    one: the copy owns its own parameters (changing the original's is not seen by the copy, nor
    the reverse), computes like eager, and trains (gradients land on its own parameters)."""
    import copy
    import io

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 12)
    c = novaforge.compile(m, backend=backend, freeze=freeze)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))
    buf = io.BytesIO()
    torch.save(c, buf)
    buf.seek(0)
    for twin in (copy.deepcopy(c), torch.load(buf, weights_only=False)):
        twin_module = twin.fn
        assert all(p is not q for p, q in zip(m.parameters(), twin_module.parameters(), strict=True))
        with torch.no_grad():
            torch.testing.assert_close(twin(x), m(x))
            m[0].weight.mul_(2.0)  # the original changes; the copy keeps its own weights
            torch.testing.assert_close(twin(x), twin_module(x))
            torch.testing.assert_close(c(x), m(x))
            m[0].weight.div_(2.0)
        if not freeze:
            twin(x).square().sum().backward()
            assert all(p.grad is None for p in m.parameters())
            ref = copy.deepcopy(twin_module)
            ref.zero_grad()
            ref(x).square().sum().backward()
            for p, q in zip(twin_module.parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)


def check_dtype_errors(backend: str) -> None:
    lin = torch.nn.Linear(5, 3)
    c = novaforge.compile(lin, backend=backend)
    for dt in (torch.float64, torch.int64, torch.bfloat16):
        x = torch.randn(2, 5).to(dt)
        with pytest.raises(RuntimeError):
            lin(x)
        with pytest.raises(RuntimeError):
            c(x)
    # layer/group norms: a 16-bit input with float32 parameters is allowed, other mixes raise
    for fn in (lambda x, w, b: torch.nn.functional.layer_norm(x, (5,), w, b),
               lambda x, w, b: torch.nn.functional.group_norm(x, 1, w, b)):
        cf = novaforge.compile(fn, backend=backend)
        for xdt, pdt in ((torch.float32, torch.bfloat16), (torch.float64, torch.float32),
                         (torch.float16, torch.bfloat16), (torch.bfloat16, torch.float32)):
            args = (torch.randn(2, 5).to(xdt), torch.randn(5).to(pdt), torch.randn(5).to(pdt))
            try:
                want = fn(*args)
            except RuntimeError:
                with pytest.raises(RuntimeError, match="mixed dtype"):
                    cf(*args)
                continue
            torch.testing.assert_close(cf(*args), want, atol=1e-2, rtol=1e-2)
    # zero-size inputs keep the norms' dtype errors
    with pytest.raises(RuntimeError, match="mixed dtype"):
        novaforge.compile(torch.nn.LayerNorm(5), backend=backend)(torch.randn(0, 5, dtype=torch.float64))
    # index_add of another dtype's source: eager raises (the decomposition would cast)
    ci = novaforge.compile(lambda x, i, s: x.index_add(0, i, s), backend=backend)
    x, i = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match="same scalar type"):
        ci(x, i, torch.randn(2, 3))
    torch.testing.assert_close(ci(x, i, torch.ones(2, 3, dtype=torch.float64)), x.index_add(0, i, torch.ones(2, 3,
                                                                                                          dtype=torch.float64)))


def check_concurrent_first_calls(backend: str) -> None:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(3, 8)
    with torch.no_grad():
        want, want_other = m(x), other(x)
    c, c_other = novaforge.compile(m, backend=backend), novaforge.compile(other, backend=backend)
    errors: list[str] = []
    stop = threading.Event()

    def compiled(cm, w):
        try:
            with torch.no_grad():
                torch.testing.assert_close(cm(x), w)
        except Exception as e:  # collected and re-raised in the main thread
            errors.append(repr(e))

    def eager():
        while not stop.is_set():
            try:
                with torch.no_grad():
                    torch.testing.assert_close(m(x), want)
            except Exception as e:
                errors.append("eager: " + repr(e))
                return

    threads = [threading.Thread(target=compiled, args=a) for a in ((c, want), (c, want), (c_other, want_other))]
    e = threading.Thread(target=eager)
    e.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    e.join()
    assert errors == []
    assert c.compilations == 1 and c_other.compilations == 1


def check_integer_pow(backend: str) -> None:
    x = torch.arange(-4, 5)
    for fn in (lambda x: torch.pow(x, 2), lambda x: x ** 3, lambda x: torch.pow(x, x.abs() % 3)):
        got, want = novaforge.compile(fn, backend=backend)(x), fn(x)
        assert got.dtype == want.dtype and torch.equal(got, want)


def _looked_up_and_gathered(ids, table, cols):
    rows = torch.nn.functional.embedding(ids, table) * 2
    return rows, torch.gather(table, 1, cols)


def check_index_error(backend: str) -> None:
    """An out-of-range index raises IndexError, as eager does; on the CPU backend the message
    names the ATen op and the user's source line (the generated kernels check their indices)."""
    e = torch.nn.Embedding(10, 4)
    ids = torch.tensor([[1, 12]])
    with pytest.raises(IndexError):
        e(ids)
    with pytest.raises(IndexError):
        novaforge.compile(e, backend=backend)(ids)
    table, ok, cols = torch.randn(10, 4), torch.tensor([[1, 9]]), torch.tensor([[0, 3], [1, 2]])
    c = novaforge.compile(_looked_up_and_gathered, backend=backend)
    torch.testing.assert_close(c(ok, table, cols), _looked_up_and_gathered(ok, table, cols))
    line = "contract_cases.py:" if backend == "cpu" else ""
    # eager raises IndexError for the embedding, RuntimeError for gather: so does the compiled call
    for bad_ids, bad_cols, op, kind in ((ids, cols, "aten.embedding", IndexError),
                                        (ok, torch.tensor([[0, 4], [1, 2]]), "aten.gather", RuntimeError)):
        with pytest.raises(kind):
            _looked_up_and_gathered(bad_ids, table, bad_cols)
        with pytest.raises(kind, match=f"{op}.*{line}" if line else "out of"):
            c(bad_ids, table, bad_cols)


def check_mutation_from_another_mutated_input(backend: str) -> None:
    """An input's new value is another input's old value, and that input is mutated too (fuzz
    seed 509421): eager writes x0 before x1 changes; the compiled call must neither update x1 in
    place before x0 reads it nor write x1 back first."""
    def f(x0, x1):
        v = x0.copy_(x1)
        x1.relu_()
        return v

    def g(x1, x0):  # the same with the inputs' order (the write-backs' order) reversed
        x0.copy_(x1)
        x1.relu_()
        return x0

    for fn in (f, g):
        a, b = torch.tensor([-0.375, 2.0]), torch.tensor([-1.5, 0.25])
        a2, b2 = a.clone(), b.clone()
        want = fn(a, b)
        got = novaforge.compile(fn, backend=backend)(a2, b2)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(a2, a)
        torch.testing.assert_close(b2, b)


def check_autocast_modes(backend: str) -> None:
    """A call under `torch.autocast` returns what eager returns there (bfloat16 results), a call
    outside it float32 ones, in any order: the autocast mode is part of the program's key, so a
    program traced in one mode is never reused in the other (it was: a float32 call after an
    autocast one returned bfloat16). Each mode compiles once; gradients under autocast too."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    c = novaforge.compile(m, backend=backend)
    x = torch.randn(3, 8)
    for mode in ("autocast", "plain", "autocast", "plain"):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()
        with torch.no_grad(), ctx:
            got, want = c(x), m(x)
        assert got.dtype == want.dtype, (mode, got.dtype, want.dtype)
        tol = dict(atol=2e-2, rtol=2e-2) if mode == "autocast" else dict(atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, want, **tol)
    assert c.compilations == 2
    ref = copy.deepcopy(m)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c(x).float().square().sum().backward()
        ref(x).float().square().sum().backward()
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=5e-2, rtol=5e-2)


def check_module_modes(backend: str) -> None:
    """`model.train()` / `model.eval()` after a compile, and hooks added or removed, are seen as
    eager sees them (they were not: a program traced in eval mode kept running after
    `train()`, without BatchNorm's batch statistics or its running-stat updates): the training
    flags and hook counts are part of the program's key; each state compiles once."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
            return self.fc(h) * (2.0 if self.training else 1.0)

    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    c = novaforge.compile(m, backend=backend)
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        for mode in ("eval", "train", "eval", "train"):
            for mod in (m, ref):
                mod.train(mode == "train")
            torch.testing.assert_close(c(x), ref(x), atol=1e-4, rtol=1e-4, msg=mode)
            torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean, atol=1e-5, rtol=1e-5, msg=mode)
        assert c.compilations == 2
        m.eval()
        ref.eval()
        handles = [mod.fc.register_forward_hook(lambda _m, _i, o: o * 3 + 1) for mod in (m, ref)]
        torch.testing.assert_close(c(x), ref(x), atol=1e-4, rtol=1e-4, msg="hook added")
        for h in handles:
            h.remove()
        torch.testing.assert_close(c(x), ref(x), atol=1e-4, rtol=1e-4, msg="hook removed")


def check_attribute_changes(backend: str) -> None:
    """A plain attribute changed after the compile (`m.scale = 2.0`), a list attribute appended
    to, a parameterless submodule swapped (`m.act = nn.ReLU()`) and a function attribute
    swapped are seen as eager sees them
    (they were not: the program traced with the old values kept running, silently different from
    eager); a state seen before gets its program again without compiling."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.act = torch.nn.GELU()
            self.scale = 1.0
            self.offsets = [1]
            self.post = torch.tanh

        def forward(self, x):
            return self.post(self.act(self.fc(x)) * self.scale + float(sum(self.offsets)))

    torch.manual_seed(0)
    m = Net()
    c = novaforge.compile(m, backend=backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        def same(msg: str) -> None:
            torch.testing.assert_close(c(x), m(x), atol=1e-4, rtol=1e-4, msg=msg)

        same("first")
        gelu, relu = m.act, torch.nn.ReLU()
        m.scale = 3.0
        same("scale changed")
        m.offsets.append(5)
        same("list appended to")
        m.act = relu
        same("submodule swapped")
        m.post = torch.sigmoid
        same("function swapped")
        assert c.compilations == 5
        m.act, m.scale, m.offsets, m.post = gelu, 1.0, [1], torch.tanh
        same("all changed back")
        m.scale = 3.0
        m.offsets.append(5)
        m.act = relu
        m.post = torch.sigmoid
        same("changed again")
        assert c.compilations == 5  # (every state was seen before)
