"""IR basics: types, verifier, printer, structural keys, Rewriter purity."""

from __future__ import annotations

import pytest
import torch

from novaforge.ir import Graph, GraphInput, Node, Rewriter, TensorType, Value, VerifyError, make_node, verify
from novaforge.ir.graph import Attrs
from novaforge.ir.structural import graph_key, value_keys
from novaforge.ir.types import broadcast_shapes
from novaforge.runtime.interpret import interpret


def f32(*shape):
    return TensorType(tuple(shape), torch.float32)


def small_graph():
    x = Value(f32(2, 3), "x")
    y = Value(f32(3), "y")
    a = make_node("add", [x, y])
    e = make_node("exp", [a.out])
    s = make_node("sum", [e.out], {"axes": (1,), "keepdim": True})
    return Graph([GraphInput(x, "user", "x"), GraphInput(y, "user", "y")], [a, e, s], [s.out])


def test_tensor_type_basics():
    t = f32(2, 3)
    assert t.numel == 6 and t.nbytes == 24 and t.rank == 2 and str(t) == "f32[2,3]"
    assert TensorType.of(torch.zeros(4, dtype=torch.bfloat16)).itemsize == 2
    with pytest.raises(ValueError):
        TensorType((-1,), torch.float32)
    assert broadcast_shapes((2, 1, 3), (4, 1)) == (2, 4, 3)
    with pytest.raises(ValueError):
        broadcast_shapes((2, 3), (4,))


def test_verify_accepts_and_interprets():
    g = small_graph()
    verify(g)
    x, y = torch.randn(2, 3), torch.randn(3)
    (out,) = interpret(g, [x, y])
    torch.testing.assert_close(out, (x + y).exp().sum(1, keepdim=True))


def test_verify_rejects_use_before_def():
    g = small_graph()
    bad = Graph(g.inputs, [g.nodes[1], g.nodes[0], g.nodes[2]], g.outputs)
    with pytest.raises(VerifyError, match="before definition"):
        verify(bad)


def test_verify_rejects_double_assignment():
    g = small_graph()
    n = g.nodes[1]
    dup = Node(n.op, n.inputs, n.attrs, n.outputs)
    with pytest.raises(VerifyError, match="SSA"):
        verify(Graph(g.inputs, list(g.nodes) + [dup], g.outputs))


def test_verify_rejects_wrong_type_and_attrs():
    g = small_graph()
    a = g.nodes[0]
    wrong = Node("add", a.inputs, a.attrs, [Value(f32(3, 2))])
    with pytest.raises(VerifyError, match="output types"):
        verify(Graph(g.inputs, [wrong], [wrong.out]))
    s = g.nodes[2]
    bad_attrs = Node("sum", s.inputs, Attrs(axes=(1,)), s.outputs)
    with pytest.raises(VerifyError, match="attributes"):
        verify(Graph(g.inputs, [g.nodes[0], g.nodes[1], bad_attrs], g.outputs))
    with pytest.raises(TypeError):
        make_node("add", [Value(f32(2)), Value(TensorType((2,), torch.int64))])


def test_printer_is_readable_and_name_independent():
    g1, g2 = small_graph(), small_graph()
    assert str(g1) == str(g2)
    text = str(g1)
    assert "add(%0, %1)" in text and "sum(%3, axes=[1], keepdim=True)" in text and "return %4" in text


def test_structural_keys_ignore_names_but_not_structure():
    g1, g2 = small_graph(), small_graph()
    assert graph_key(g1) == graph_key(g2)
    k1, k2 = value_keys(g1), value_keys(g2)
    assert [k1[n.out] for n in g1.nodes] == [k2[n.out] for n in g2.nodes]
    # different attrs -> different key
    x = g1.inputs[0].value
    s3 = make_node("sum", [x], {"axes": (0,), "keepdim": True})
    s4 = make_node("sum", [x], {"axes": (1,), "keepdim": True})
    g3 = Graph(g1.inputs, [s3], [s3.out])
    g4 = Graph(g1.inputs, [s4], [s4.out])
    assert graph_key(g3) != graph_key(g4)


def test_rewriter_does_not_touch_the_input_graph():
    g = small_graph()
    before = str(g)
    rw = Rewriter(g)
    for n in g.nodes:
        if n.op == "exp":
            new = rw.emit("exp", [n.inputs[0]])
            new2 = rw.emit("mul", [new.out, rw.emit("scalar", [], value=1.0, dtype=torch.float32).out])
            rw.replace(n.out, new2.out)
        else:
            rw.keep(n)
    g2 = rw.finish()
    verify(g2)
    assert str(g) == before
    assert len(g2.nodes) == len(g.nodes) + 2
    x, y = torch.randn(2, 3), torch.randn(3)
    torch.testing.assert_close(interpret(g, [x, y])[0], interpret(g2, [x, y])[0])


def test_attrs_are_immutable_and_hashable():
    a = Attrs(axes=[1, 2], keepdim=False)
    assert a["axes"] == (1, 2)
    assert hash(a) == hash(Attrs(axes=(1, 2), keepdim=False))
    with pytest.raises(TypeError):
        a["x"] = 1  # type: ignore[index]


def test_scalar_op_fills_on_its_device_without_a_host_copy(monkeypatch):
    """The `scalar` op runs as a fill on its device: `torch.tensor(value, device=...)` copies from
    host memory, which CUDA graph capture forbids (compile_step's capture on the H200 failed on
    the scalars of an interpreted kernel body)."""
    from novaforge.ir import OPS

    real = torch.tensor

    def no_device_tensor(*args, device=None, **kwargs):
        assert device in (None, "cpu", torch.device("cpu")), "a host-to-device copy"
        return real(*args, device=device, **kwargs)

    monkeypatch.setattr(torch, "tensor", no_device_tensor)
    for dtype, value in ((torch.float32, 1.5), (torch.int64, -3), (torch.bool, True), (torch.bfloat16, 0.25)):
        got = OPS["scalar"].impl([], {"value": value, "dtype": dtype, "device": "meta"})
        assert got.shape == () and got.dtype == dtype and got.device.type == "meta"
        cpu = OPS["scalar"].impl([], {"value": value, "dtype": dtype, "device": "cpu"})
        assert cpu.item() == real(value, dtype=dtype).item()


def test_canonical_forms_of_aten_argument_values():
    """An extern node keeps its ATen call's arguments as attributes: layouts and memory formats
    (`empty_permuted(..., layout=torch.strided)` in Mixtral's routing), complex scalars and enums
    have stable text forms, equal values give equal forms, different values different ones."""
    import enum

    from novaforge.ir.structural import canonical

    class Mode(enum.Enum):
        A = 1
        B = 2

    values = [torch.strided, torch.sparse_coo, torch.contiguous_format, torch.channels_last, 1 + 2j, 1 - 2j,
              Mode.A, Mode.B, 1.0, 1, True]
    forms = [canonical(v) for v in values]
    assert len(set(forms)) == len(values), forms
    assert canonical((torch.strided, Mode.A)) == canonical((torch.strided, Mode.A))
    with pytest.raises(TypeError, match="no canonical form"):
        canonical(object())
