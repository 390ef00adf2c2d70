"""The hoist pass on hand-built kernel IR: a run-time loop's per-iteration
index arithmetic becomes named values at the top of its body, with the
same values; what depends on inner loops or on ring state stays put."""

import itertools

import circbuf as cb
from circbuf.ir import Const, MemoryType, ParallelType, Var
from circbuf.ir.scalar import Bin, ceil_div, evaluate
from circbuf.lowering.hoist import hoist_indices
from circbuf.lowering.kir import Assign, ForLoop, IfThenElse, Kernel, Let, TensorRef
from circbuf.lowering.simplify_indices import simplify_indices
from tests.util import D


def _tvs():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=D.Float)
        y = fd.define_tensor([-1], dtype=D.Float)
        fd.add_output(fd.ops.exp(x))
    x.memory_type = y.memory_type = MemoryType.Global
    return x, y


def _kernel(body):
    return Kernel(
        "k",
        body,
        [],
        [],
        {ParallelType.TIDx: Const(128)},
        {"i0": (0, 0), "i1": (0, 1)},
        {},
    )


def test_tile_coordinates_are_named_once_per_iteration_with_the_same_values():
    x, y = _tvs()
    j, k = Var("j"), Var("k")
    tid = Var("threadIdx.x")
    tile = ((j // 8) % ceil_div(Var("i1"), 256)) * 256
    idx = tile + (tid % 4) * 2 + k * 8  # tile part + per-thread part + inner-loop part
    stage = Var("X_use_stage")  # ring state: changes inside the loop, never hoisted
    read = Assign(TensorRef(y, idx), None, [TensorRef(x, idx + stage)])
    bound = (tile + k * 64).lt(Var("i1"))  # the tile's own coordinate alone
    guard = IfThenElse(bound, [read])
    inner = ForLoop(k, Const(4), [guard])
    outer = ForLoop(j, Var("T"), [inner], start=Var("blockIdx.x"), step=Const(132))
    before = [str(guard.cond), str(read.lhs.index), str(read.operands[0].index)]
    k_ = hoist_indices(_kernel([outer]))
    lets = [n for n in outer.body if isinstance(n, Let)]
    assert [str(n.var) for n in lets] == ["j_0", "j_1"] and outer.body[len(lets)] is inner
    assert str(lets[0].value) == str(tile)
    assert str(lets[1].value) == "(j_0 + ((threadIdx.x % 4) * 2))"
    # every use reads the name; inner-loop and ring parts stay in the use
    assert str(read.lhs.index) == "(j_1 + (k * 8))"
    assert "j_1" in str(read.operands[0].index) and "X_use_stage" in str(read.operands[0].index)
    assert str(guard.cond) == "((j_0 + (k * 64)) < i1)"
    assert k_.body == [outer]
    # the same values: evaluate the original and the hoisted forms
    for jv, kv, t, i1 in itertools.product((0, 7, 8, 133), (0, 3), (0, 5, 127), (256, 1000)):
        env = {"j": jv, "k": kv, "threadIdx.x": t, "i1": i1, "X_use_stage": 1}
        for let in lets:
            env[let.var.name] = evaluate(let.value, env)
        assert evaluate(read.lhs.index, env) == evaluate(idx, env)
        assert evaluate(guard.cond, env) == evaluate(bound, env)
    assert before[1] != str(read.lhs.index)


def test_cheap_or_single_top_level_uses_and_unrolled_loops_are_left_alone():
    x, y = _tvs()
    j = Var("j")
    cheap = Assign(TensorRef(y, j * 4 + 1), None, [TensorRef(x, j * 4)])
    once = Assign(TensorRef(y, (j // 3) * 7), None, [TensorRef(x, Const(0))])
    loop = ForLoop(j, Var("T"), [cheap, once])
    unrolled = ForLoop(Var("u"), Const(8), [Assign(TensorRef(y, (Var("u") // 3) * 5), None, [])])
    hoist_indices(_kernel([loop, unrolled]))
    assert not [n for n in loop.body if isinstance(n, Let)]
    assert not [n for n in unrolled.body if isinstance(n, Let)]


def test_a_loops_own_bound_leaves_the_conditions_in_its_body():
    x, y = _tvs()
    j, T = Var("j"), ceil_div(Var("i0"), 16)
    cond = Bin("&&", (j * 16 + Var("threadIdx.x")).lt(Var("i0")), j.lt(T), j.lt(T).dtype)
    guard = IfThenElse(cond, [Assign(TensorRef(y, j), None, [TensorRef(x, j)])])
    outside = IfThenElse(Var("q").lt(T), [])
    loop = ForLoop(j, T, [guard], start=Var("blockIdx.x"), step=Const(132))
    simplify_indices(_kernel([loop, outside]))
    assert str(guard.cond) == "(((j * 16) + threadIdx.x) < i0)"
    assert str(outside.cond) == "(q < ceilDiv(i0, 16))"
