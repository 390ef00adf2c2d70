"""The lowering passes' contracts (circbuf/lowering/passes.py): lower()
refuses a misordered list of passes by name; over kernels of every scheduler,
each pass reads only the Kernel fields the loop nest or its ``requires`` give
it and writes only those it ``provides``; and single passes run on kernel IR
built by hand."""

import pytest
import torch

import circbuf.compiler as compiler
import circbuf.lowering as L
from circbuf.ir import Const, MemoryType, ParallelType, TensorView, Var
from circbuf.ir.iterdomain import IterDomain
from circbuf.lowering.kir import (
    Assign,
    BlockSync,
    Comment,
    Fence,
    ForLoop,
    IfThenElse,
    Kernel,
    MBarrierInit,
    MBarrierInval,
    MBarrierRef,
    MBarrierWait,
    Return,
    Role,
    RoleSwitch,
    TensorRef,
    walk,
)
from circbuf.lowering.mbarriers import setup_mbarriers
from circbuf.lowering.passes import (
    KERNEL_FIELDS,
    LOOP_NEST_PROVIDES,
    Pass,
    PassOrderError,
    check_order,
    contract_table,
)
from circbuf.lowering.sync import insert_syncs
from tests.test_gpu_matmul import mm_fusion
from tests.util import D, axpy_fusion, manual_ws_exp, norm_fusion, norm_inputs, outer_fusion

BF = torch.bfloat16


# ------------------------------------------------------------------ corpus
def _pointwise():
    return axpy_fusion(D.BFloat16, 2), [torch.randn(64, 1024, dtype=BF)] * 2


def _pointwise_tma(**ov):
    def build():
        fd = axpy_fusion(D.BFloat16, 2)
        fd.fusion.schedule(stages=3, **ov)
        return fd, [torch.randn(1000, 1024, dtype=BF)] * 2

    return build


def _pointwise_tma_ws():
    fd = axpy_fusion(D.Half, 3)
    fd.fusion.schedule(stages=4, warp_specialized=True)
    return fd, [torch.randn(3, 77, 512, dtype=torch.float16)] * 2


def _norm(kind, rows, cols, **ov):
    def build():
        fd = norm_fusion(kind, D.BFloat16)
        if ov:
            fd.fusion.schedule(**ov)
        return fd, norm_inputs(kind, rows, cols, BF, "cpu")

    return build


def _outer(ws):
    def build():
        fd = outer_fusion("sum")
        if ws is not None:
            fd.fusion.schedule(stages=3, warp_specialized=ws)
        return fd, [torch.randn(8192, 4096, dtype=BF)]

    return build


def _matmul(kind="matmul", epilogue=None, **ov):
    def build():
        fd = mm_fusion(kind, epilogue=epilogue)
        if ov:
            fd.fusion.schedule(**ov)
        m, n, k = 1000, 1032, 520
        b = torch.randn((n, k) if kind == "linear" else (k, n), dtype=BF)
        return fd, [torch.randn(m, k, dtype=BF), b]

    return build


def _peer_store(kind):
    """A linear whose output goes to peer GPUs (issue 22: the peer_stores and peer_order passes)."""

    def build():
        from circbuf.ir.peer import PeerStore

        fd = mm_fusion("linear")
        fd.fusion.outputs[0].peer_store = PeerStore(kind, 2)
        return fd, [torch.randn(1000, 520, dtype=BF), torch.randn(1032, 520, dtype=BF)]

    return build


def _manual_ws():
    return manual_ws_exp(128, 4), [torch.randn(256, 512, dtype=BF)]


# (label, expected params type or None for a manual schedule, builder)
CORPUS = [
    ("pointwise", "PointwiseParams", _pointwise),
    ("pointwise_tma", "PointwiseTmaParams", _pointwise_tma()),
    ("pointwise_tma_store", "PointwiseTmaParams", _pointwise_tma(tma_store=True)),
    ("pointwise_tma_ws", "PointwiseTmaParams", _pointwise_tma_ws),
    ("norm_registers", "NormalizationParams", _norm("softmax", 4096, 4096)),
    ("norm_tma", "NormalizationParams", _norm("layer_norm", 1024, 8192, staging="tma")),
    ("norm_tma_mbarrier", "NormalizationParams", _norm("rms_norm", 512, 4096, staging="tma", war="mbarrier")),
    ("norm_ws", "NormalizationParams", _norm("layer_norm", 4096, 4096, stages=3, warp_specialized=True)),
    ("outer_reduction", "OuterReductionParams", _outer(None)),
    ("outer_reduction_ws", "OuterReductionParams", _outer(True)),
    ("reduction", "ReductionParams", _norm("softmax", 64, 1001)),
    ("matmul_cooperative", "MatmulParams", _matmul()),
    ("matmul_bias_gelu", "MatmulParams", _matmul("linear", "gelu")),
    ("matmul_pingpong", "MatmulParams", _matmul(pingpong=True, tile=(64, 256, 64))),
    ("matmul_not_persistent", "MatmulParams", _matmul(persistent=False)),
    ("matmul_split_k", "MatmulParams", _matmul("linear", "gelu", split_k=3)),
    ("matmul_all_gather", "MatmulParams", _peer_store("all_gather")),
    ("matmul_reduce_scatter", "MatmulParams", _peer_store("reduce_scatter")),
    ("manual_ws_setmaxnreg", None, _manual_ws),
]


# ---------------------------------------------------------------- tracking
class _Log:
    """Reads and writes of Kernel fields, per pass."""

    def __init__(self):
        self.phase = None
        self.reads: dict = {}
        self.writes: dict = {}
        self.snap: dict = {}


def _snapshot(kernel) -> dict:
    """Each field's object, and a container's items (to see in-place changes)."""
    out = {}
    for f in KERNEL_FIELDS:
        v = object.__getattribute__(kernel, f)
        items = list(v.items()) if isinstance(v, dict) else list(v) if isinstance(v, list) else None
        out[f] = (v, items)
    return out


def _changed(a, b) -> bool:
    (va, ia), (vb, ib) = a, b
    if va is not vb:  # assigned
        return True
    if ia is None:
        return False
    if len(ia) != len(ib):
        return True
    if isinstance(va, dict):
        return any(ka != kb or xa is not xb for (ka, xa), (kb, xb) in zip(ia, ib))
    return any(x is not y for x, y in zip(ia, ib))


class TrackedKernel(Kernel):
    """A Kernel whose field reads and assignments go to the current pass's log
    (``_log``); in-place changes of a field's contents are found by
    comparing snapshots taken around each pass."""

    def __getattribute__(self, name):
        if name in _TRACKED:
            log = object.__getattribute__(self, "_log")
            if log.phase is not None:
                log.reads.setdefault(log.phase, set()).add(name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        if name in _TRACKED:
            log = object.__getattribute__(self, "_log")
            if log.phase is not None:
                log.writes.setdefault(log.phase, set()).add(name)
        object.__setattr__(self, name, value)


_TRACKED = frozenset(KERNEL_FIELDS)


def _traced_lower(logs):
    """A stand-in for ``compiler.lower`` that runs lower() on a TrackedKernel
    and appends each kernel's log to ``logs``."""
    real = L.lower

    def lower(fusion, **kw):
        log = _Log()
        outer = kw.pop("after_pass", None)
        names = [p.name for p in L.PASSES]

        def after(name, kernel):
            if name == "loop_nest":
                object.__setattr__(kernel, "_log", log)
                kernel.__class__ = TrackedKernel
            else:
                log.phase = None
                snap = _snapshot(kernel)
                for f in KERNEL_FIELDS:
                    if _changed(log.snap[f], snap[f]):
                        log.writes.setdefault(name, set()).add(f)
            if outer is not None:
                outer(name, kernel)
            k = names.index(name) + 1 if name != "loop_nest" else 0
            if k < len(names):
                log.snap = _snapshot(kernel)
                log.phase = names[k]

        kernel = real(fusion, after_pass=after, **kw)
        log.phase = None
        kernel.__class__ = Kernel
        logs.append(log)
        return kernel

    return lower


def _traced_codegen(kernel, **kw):
    """codegen on a TrackedKernel: its writes go to the phase "codegen" of the
    kernel's lowering log."""
    log = object.__getattribute__(kernel, "_log")
    kernel.__class__ = TrackedKernel
    log.phase, snap = "codegen", _snapshot(kernel)
    try:
        return L.codegen(kernel, **kw)
    finally:
        log.phase = None
        for f in KERNEL_FIELDS:
            if _changed(snap[f], _snapshot(kernel)[f]):
                log.writes.setdefault("codegen", set()).add(f)
        kernel.__class__ = Kernel


def lower_corpus() -> dict:
    """Lower every fusion of CORPUS with field tracking (NVRTC left out: only lowering is at stake)."""
    mp = pytest.MonkeyPatch()
    logs: dict = {}
    try:
        mp.delenv("CIRCBUF_DEBUG_HANG", raising=False)
        mp.setenv("CIRCBUF_CACHE_DIR", "")  # every fusion lowered here, none loaded from the kernel cache
        mp.setattr("circbuf.runtime.nvrtc.compile_cuda", lambda src, arch, name: b"")
        mp.setattr(compiler, "codegen", _traced_codegen)
        for label, params, build in CORPUS:
            fd, inputs = build()
            got: list = []
            mp.setattr(compiler, "lower", _traced_lower(got))
            ck = fd.compile(inputs, arch="sm_90a")
            if params is not None:
                assert type(ck.params).__name__ == params, (label, ck.params)
            logs[label] = got
    finally:
        mp.undo()
    return logs


@pytest.fixture(scope="module")
def corpus_logs():
    return lower_corpus()


# ------------------------------------------------------------------ order
def _passes(*names):
    by = {p.name: p for p in L.PASSES}
    return [by[n] for n in names]


def test_the_pass_list_keeps_its_contracts():
    check_order(L.PASSES)
    for p in L.PASSES:
        assert set(p.provides) <= set(KERNEL_FIELDS) | _IR_FACTS, p.name
        assert set(p.renames) <= set(KERNEL_FIELDS), p.name


@pytest.mark.parametrize(
    "move, match",
    [
        # the barriers set up before the rings registered theirs
        (("mbarriers", 6), r"'mbarriers' requires 'rings', which neither the loop nest nor an earlier pass"),
        # between tma_store and circular_buffer: circular_buffer still adds to the table
        (("mbarriers", 10), r"'mbarriers' requires 'rings'"),
        # allocation looks for placed exprs, which indexing has turned into assignments
        (("allocation", 1), r"'allocation' requires 'loop_nest', which the earlier pass 'indexing' consumed"),
        (("predicate", 3), r"'predicate' requires 'vectorized'"),
        # sync must see the consumers' named barrier and every barrier the others add
        (("sync", 10), r"'sync' requires 'pipelined'"),
        (("circular_buffer", 8), r"'circular_buffer' requires 'turns'"),
        # split-K's sums, the turn barriers and TMA stores are placed per role
        (("roles", 9), r"'split_k' requires 'roles'"),
    ],
)
def test_a_misordered_pass_list_fails_loudly(monkeypatch, move, match):
    name, at = move
    passes = [p for p in L.PASSES if p.name != name]
    passes.insert(at, next(p for p in L.PASSES if p.name == name))
    with pytest.raises(PassOrderError, match=match):
        check_order(passes)
    # lower() checks before running anything: no pass (not even the loop nest) ran
    monkeypatch.setattr(L, "PASSES", passes)
    seen = []
    fd, _ = _pointwise()
    with pytest.raises(PassOrderError, match=match):
        L.lower(fd.fusion, after_pass=lambda n, k: seen.append(n))
    assert seen == []


def test_a_fact_changed_by_a_later_pass_is_refused():
    def fn(k):
        return k

    reader = Pass("reader", fn, requires=("rings",))
    adder = Pass("adder", fn, provides=("rings",))
    other = Pass("other", fn, provides=("rings",))
    check_order([adder, other, reader])
    with pytest.raises(PassOrderError, match="'reader' requires 'rings', which the later pass 'other'"):
        check_order([adder, reader, other])
    with pytest.raises(PassOrderError, match="'reader' requires 'rings', which neither"):
        check_order([reader, adder])
    # a later pass that only renames a fact leaves it valid for the earlier reader
    renamer = Pass("renamer", fn, renames=("rings",))
    check_order([adder, reader, renamer])
    with pytest.raises(PassOrderError, match="'reader' requires 'rings', which neither"):
        check_order([renamer, reader])  # renaming provides nothing


def test_the_package_docstring_shows_the_contracts():
    doc = " ".join(L.__doc__.split())
    assert " ".join(contract_table(L.PASSES).split()) in doc, contract_table(L.PASSES)
    for p in L.PASSES:
        mod = __import__(p.fn.__module__, fromlist=["_"])
        want = f"Requires: {', '.join(p.requires) or 'nothing'}; provides: {', '.join(p.provides)}"
        want += f"; consumes: {', '.join(p.consumes)}" if p.consumes else ""
        want += f"; renames: {', '.join(p.renames)}." if p.renames else "."
        assert want in " ".join(mod.__doc__.split()), (p.name, want)


# ---------------------------------------------------- reads and writes per pass
_IR_FACTS = {
    "loop_nest", "allocated", "indexed", "approximated", "vectorized", "predicated", "wgmma_synced",
    "role_switch", "turns", "tma_stores_synced", "pipelined", "mbarriers_allocated", "simplified", "hoisted",
    "synced", "named", "peer_stores", "peer_order", "one_trip_dropped", "split_k_summed",
}  # fmt: skip


def _allowed_reads(k: int) -> set:
    """What pass k may read: what it requires, and the loop nest's fields and
    its own that no earlier pass changed."""
    p = L.PASSES[k]
    earlier = set().union(*(set(q.provides) | set(q.renames) for q in L.PASSES[:k]))
    return set(p.requires) | ((set(LOOP_NEST_PROVIDES) | set(p.provides)) - earlier)


def test_each_pass_reads_and_writes_only_what_it_declares(corpus_logs):
    for label, logs in corpus_logs.items():
        assert logs, label
        for log in logs:
            for k, p in enumerate(L.PASSES):
                undeclared = log.reads.get(p.name, set()) - _allowed_reads(k)
                assert not undeclared, (
                    f"{label}: pass {p.name} reads {sorted(undeclared)} without requiring it"
                )
                undeclared = log.writes.get(p.name, set()) - set(p.provides) - set(p.renames)
                assert not undeclared, (
                    f"{label}: pass {p.name} writes {sorted(undeclared)} without providing it"
                )
            # codegen runs after every pass; it only records that the kernel takes a hang record
            assert log.writes.get("codegen", set()) <= {"hang_record"}, label


def test_every_declared_field_is_used_on_the_corpus(corpus_logs):
    """The declarations are no wider than the passes: each Kernel field a pass
    requires is read, and each it provides written, on some kernel of the corpus
    (which also shows the corpus reaches every pass's field traffic)."""
    for p in L.PASSES:
        reads = set().union(*(log.reads.get(p.name, set()) for logs in corpus_logs.values() for log in logs))
        writes = set().union(
            *(log.writes.get(p.name, set()) for logs in corpus_logs.values() for log in logs)
        )
        fields = set(KERNEL_FIELDS)
        assert set(p.requires) & fields <= reads, (p.name, set(p.requires) & fields - reads)
        assert set(p.provides) & fields <= writes, (p.name, set(p.provides) & fields - writes)
        assert set(p.renames) <= writes, (p.name, set(p.renames) - writes)


def test_the_tracker_sees_reads_writes_and_in_place_changes():
    """The recording itself: a stand-in pass list whose passes touch fields in
    each way is logged field by field."""
    fd, _ = _pointwise()  # lowered unscheduled: one thread, one loop per axis

    def reader(k):
        _ = k.launch, k.roles
        return k

    def appender(k):
        k.mbarrier("x", 1, 1)  # reads and appends to k.mbarriers
        return k

    def setter(k):
        k.min_blocks = 2
        k.named_barriers["p"] = (1, 1)  # an in-place change, no assignment
        return k

    passes = [Pass("reader", reader), Pass("appender", appender), Pass("setter", setter)]
    logs: list = []
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(L, "PASSES", passes)
        _traced_lower(logs)(fd.fusion)
    finally:
        mp.undo()
    (log,) = logs
    assert log.reads["reader"] == {"launch", "roles"} and "reader" not in log.writes
    assert log.reads["appender"] == {"mbarriers"} and log.writes["appender"] == {"mbarriers"}
    assert log.writes["setter"] == {"min_blocks", "named_barriers"}


# ------------------------------------------------------ passes on hand-built IR
def _tv(name, memory=MemoryType.Shared, n=128):
    tv = TensorView([IterDomain(Const(n))], D.Float, memory)
    tv.name = name
    return tv


def _kernel(body, threads=128, **fields) -> Kernel:
    return Kernel(
        name="k",
        body=body,
        tensor_params=[],
        scalar_params=[],
        launch={ParallelType.TIDx: Const(threads)},
        extent_bindings={},
        strides={},
        max_threads=threads,
        **fields,
    )


def _copy(dst, src, index=None):
    index = index if index is not None else Var("threadIdx.x")
    return Assign(TensorRef(dst, index), None, [TensorRef(src, index)])


def _of(nodes, kind):
    out = []
    walk(nodes, lambda n, _s: out.append(n) if isinstance(n, kind) else None)
    return out


def test_mbarriers_pass_sets_up_registered_barriers_around_the_body():
    j = Var("j0")
    wait = MBarrierWait(MBarrierRef("X_full", Const(0)), Var("X_use_phase"))
    loop = ForLoop(j, Const(8), [wait, Comment("read X")])
    k = _kernel([loop])
    k.mbarrier("X_full", 2, 1)
    k.mbarrier("X_empty", 2, 128)
    k = setup_mbarriers(k)
    allocs, (init_if, sync0), tail = k.body[:2], k.body[2:4], k.body[5:]
    assert [(a.name, a.count) for a in allocs] == [("X_full", 2), ("X_empty", 2)]
    assert isinstance(init_if, IfThenElse) and str(init_if.cond) == str(Var("threadIdx.x").eq(0))
    inits = [n for n in init_if.then if isinstance(n, MBarrierInit)]
    assert [(str(n.bar), str(n.arrivals)) for n in inits] == [
        ("X_full[0]", "1"), ("X_full[1]", "1"), ("X_empty[0]", "128"), ("X_empty[1]", "128"),
    ]  # fmt: skip
    assert isinstance(init_if.then[-1], Fence) and init_if.then[-1].kind == "mbarrier_init"
    assert isinstance(sync0, BlockSync) and k.body[4] is loop and loop.body[0] is wait
    # every thread reaches the end: a last sync, then thread 0 invalidates each barrier
    assert isinstance(tail[0], BlockSync) and len(_of(tail, MBarrierInval)) == 4


def test_mbarriers_pass_leaves_barriers_valid_when_a_role_returns_early():
    k = _kernel([IfThenElse(Var("threadIdx.y").eq(1), [Return()], [Comment("consumers")])])
    k.mbarrier("R_full", 3, 1)
    k = setup_mbarriers(k)
    assert len(_of(k.body, MBarrierInit)) == 3 and not _of(k.body, MBarrierInval)
    assert isinstance(k.body[-1], IfThenElse)  # nothing after the role split


def test_mbarriers_pass_without_barriers_is_the_identity():
    body = [Comment("nothing to set up")]
    assert setup_mbarriers(_kernel(body)).body == body


def test_sync_pass_on_hand_built_ir():
    """RAW between sibling statements, WAR across a loop's iterations, and the
    consumers' named barrier in a warp-specialized kernel."""
    s, r, g = _tv("S"), _tv("R", MemoryType.Local), _tv("G", MemoryType.Global)
    j = Var("j0")
    write = _copy(s, g)
    loop = ForLoop(j, Const(4), [_copy(s, g), _copy(r, s, Var("threadIdx.x") + 1)])
    k = insert_syncs(_kernel([write, _copy(r, s), loop]))
    assert [type(n).__name__ for n in k.body] == ["Assign", "BlockSync", "Assign", "ForLoop"]
    assert k.body[1].reason == "RAW on S" and k.body[1].barrier == (0, 0)
    # inside the loop: RAW before the read, WAR at the end of each iteration
    assert [type(n).__name__ for n in loop.body] == ["Assign", "BlockSync", "Assign", "BlockSync"]
    assert loop.body[-1].reason.startswith("WAR across iterations on S")

    # consumers of a warp-specialized kernel sync on their named barrier (the
    # producer branch gets none)
    consumers = [_copy(s, g), _copy(r, s)]
    producer = Role("producer", lo=2, hi=3, threads=128, registers=40, increase=False)
    mma = Role("consumers", lo=0, hi=2, threads=256)
    switch = RoleSwitch([producer, mma], [[_copy(s, g), Return()], consumers])
    k = _kernel([switch], threads=128, roles=[producer, mma])
    k.launch[ParallelType.TIDy] = Const(3)
    k = insert_syncs(k)
    assert [type(n).__name__ for n in switch.bodies[1]] == ["Assign", "BlockSync", "Assign"]
    assert switch.bodies[1][1].barrier == (Var("bar_consumers"), 256) and not _of(switch.bodies[0], BlockSync)
    assert k.named_barriers == {"consumers": (1, 1)}


def test_one_trip_pass_on_hand_built_ir():
    """A loop of one trip becomes its body with its index 0, in every Scalar its
    nodes hold (a copy's indices, a barrier's stage, a nested loop's bound); a
    ring's own loop and a strided loop stay."""
    from circbuf.lowering.one_trip import drop_one_trip_loops

    s, g = _tv("S"), _tv("G", MemoryType.Global)
    j, i, r, t = Var("j2"), Var("j3"), Var("j4"), Var("t")
    inner = ForLoop(i, Const(4), [_copy(s, g, j * 512 + i)])
    wait = MBarrierWait(MBarrierRef("X_full", j + 1), Var("X_use_phase"))
    one = ForLoop(j, Const(1), [wait, inner])
    ring = ForLoop(r, Const(1), [_copy(s, g, r)], key=7)
    strided = ForLoop(t, Const(1), [_copy(s, g, t)], start=Var("blockIdx.x"), step=Const(132))
    k = _kernel([one, ring, strided], circular_loops={"S": 7})
    k = drop_one_trip_loops(k)
    assert k.body[0] is wait and k.body[1] is inner and k.body[2:] == [ring, strided]
    assert str(wait.bar.stage) == "1" and str(inner.body[0].lhs.index) == "j3"


def test_one_trip_pass_folds_the_branches_its_index_decides():
    """``IF j != 0`` in a loop of one trip is false: its else branch stays, its then
    branch goes (no ``if (false)`` in the CUDA)."""
    from circbuf.lowering.one_trip import drop_one_trip_loops

    s, g = _tv("S"), _tv("G", MemoryType.Global)
    j = Var("j8")
    first, later = _copy(s, g), _copy(g, s)
    branch = IfThenElse(j._bin_op("!=", Const(0)), [later], [first])
    k = drop_one_trip_loops(_kernel([ForLoop(j, Const(1), [branch])]))
    assert k.body == [first]


def test_one_trip_pass_keeps_the_index_named_where_it_cannot_look():
    """A node holding the index where the substitution cannot rewrite it (a frozen
    holder) keeps it defined: ``LET j5 = 0`` before the body."""
    from dataclasses import dataclass

    from circbuf.lowering.kir import Let, Node
    from circbuf.lowering.one_trip import drop_one_trip_loops

    @dataclass(frozen=True)
    class Box:
        at: object

    @dataclass(eq=False)
    class Use(Node):
        box: Box

    j = Var("j5")
    use = Use(Box(j * 16))
    k = drop_one_trip_loops(_kernel([ForLoop(j, Const(1), [use])]))
    assert isinstance(k.body[0], Let) and k.body[0].var.name == "j5" and k.body[1] is use


def test_sync_pass_merges_syncs_separated_by_fences():
    k = insert_syncs(_kernel([BlockSync("a"), Fence("proxy_async"), BlockSync("b")]))
    assert [type(n).__name__ for n in k.body] == ["Fence", "BlockSync"] and k.body[1].reason == "a; b"


def test_sync_pass_refuses_a_block_barrier_in_a_thread_dependent_loop():
    import circbuf as cb

    t = Var("t")
    loop = ForLoop(t, Const(64), [BlockSync("x")], start=Var("threadIdx.y"), step=Const(2))
    with pytest.raises(cb.CircbufError, match="depends on threadIdx.y"):
        insert_syncs(_kernel([loop]))


def test_names_pass_on_hand_built_ir():
    """Buffers, the ring, its barriers and sides, the tile loop and the tile's
    coordinates get names from their roles; a name already taken gets a suffix;
    the fusion's own tensors keep theirs; codegen keeps the T-numbers in comments."""
    from circbuf.ir import LoadStoreOp
    from circbuf.lowering.kir import Allocate, Let, Ring, RingInit, TensorParam, TmaStore
    from circbuf.lowering.names import readable_names

    x = TensorView([IterDomain(Var("i0")), IterDomain(Var("i1"))], D.Float)
    x.name, x.is_input = "T0", True
    out = TensorView([IterDomain(Var("i0")), IterDomain(Var("i1"))], D.Float)
    out.name = "T3"
    stage = _tv("T1")
    LoadStoreOp(stage, x)  # the shared buffer copies input x
    staging = _tv("T2")
    ring = Ring("T1", 2, 1, ["T1"], "producer", ["consumers"], empty_arrivals=128)
    j, t = Var("j0"), Var("threadIdx.x")
    col, row = (j % 4) * 64, (j // 4) * 16
    lets = [Let(Var("j0_0"), col), Let(Var("j0_1"), row), Let(Var("j0_2"), Var("j0_0") + t * 8)]
    wait = MBarrierWait(MBarrierRef(ring.full, ring.use.stage), ring.use.phase)
    read = _copy(staging, stage, Var("j0_2") + ring.use.stage * 128)
    store = TmaStore(TensorRef(staging, Const(0)), 0, [Var("j0_0"), Var("j0_1")], 4096, out=out)
    loop = ForLoop(j, Var("T"), [*lets, wait, read, store], start=Var("blockIdx.x"), step=Const(132))
    body = [
        Allocate(stage, Const(128), MemoryType.Shared, stages=2, offset=Const(0)),
        Allocate(staging, Const(128), MemoryType.Shared, offset=Const(1024)),
        RingInit(ring.use),
        loop,
    ]
    k = _kernel(body, rings=[ring])
    k.tensor_params = [TensorParam(x, False), TensorParam(out, True)]
    k.scalar_params = [Var("tile")]  # "tile" is taken: the loop index is tile_1
    k = readable_names(k)
    text = str(k)
    assert "ALLOC x_stage_s_f32[128] x 2 stages" in text and "ALLOC out_stage_s_f32[128]" in text
    assert "FOR tile_1 in blockIdx.x.." in text
    assert "LET tile_col = ((tile_1 % 4) * 64)" in text and "LET tile_row = ((tile_1 / 4) * 16)" in text
    assert "LET col0 = (tile_col + (threadIdx.x * 8))" in text
    assert "MBARRIER_WAIT x_full[x_use_stage] parity=x_use_phase" in text
    assert "RING x_use (stages=2)" in text
    assert "out_stage[(col0 + (x_use_stage * 128))] = x_stage[(col0 + (x_use_stage * 128))]" in text
    assert "TMA_STORE tmap0{tile_col, tile_row} <- out_stage[0]" in text
    assert [str(r) for r in k.rings] == [
        "ring x: stages=2 prefetch=1 fill=tma producer->consumers full=x_full[2] empty=x_empty[2]"
    ]
    assert k.barrier_names == ["x_full", "x_empty"]
    assert k.former_names == {"x_stage": "T1", "out_stage": "T2", "x_full": "T1_full", "x_empty": "T1_empty"}
    assert stage.name == "T1" and x.name == "T0"  # the fusion's tensors are not renamed
    assert isinstance(k.body[0], Allocate) and k.body[0].tv is not stage
    loop.body.remove(read)  # codegen prints fusion exprs only, not the plain copy
    src = L.codegen(k)
    assert "float* x_stage = reinterpret_cast<float*>(cb_smem + 0);  // T1" in src
    assert "int x_use_stage = 0;" in src and "for (index_t tile_1 = ((index_t)blockIdx.x);" in src


def test_a_matmul_kernel_reads_like_a_persons():
    """Issue 17's list on a lowered GEMM + bias + gelu: the roles' names in the
    CUDA, the T-numbers in comments at the declarations, the tile's
    coordinates named once per tile, no ``if (1 && ...)`` and no one-element
    arrays."""
    import re

    fd = mm_fusion("linear", D.BFloat16, bias=True, epilogue="gelu")
    ins = [torch.randn(1000, 520, dtype=BF), torch.randn(1032, 520, dtype=BF), torch.randn(1032, dtype=BF)]
    src = fd.compile(ins, arch="sm_90a").cuda
    src = src[src.index('extern "C"') :]
    for decl in (
        r"__align__\(16\) float acc\[128\];  // T\d+",
        r"cb_bfloat16\* a_stage = reinterpret_cast<cb_bfloat16\*>\(cb_smem \+ \d+\);  // T\d+",
        r"cb_bfloat16\* b_stage = .*;  // T\d+",
        r"cb_bfloat16\* out_stage = .*;  // T\d+",
        r"unsigned long long ab_full\[\d\];  // T\d+_T\d+_full",
        r"for \(index_t tile = \(\(index_t\)blockIdx\.x\); tile < .*; tile \+= \d+\)",
        r"const index_t tile_n = \(\(\(tile / \d\) % ceilDiv\(i2, 256\)\) \* 256\);",
        r"int ab_load_stage = 0;",
        r"cb::mbar_wait\(&ab_full\[ab_use_stage\], \(unsigned\)\(ab_use_phase\)\);",
    ):
        assert re.search(decl, src), decl
    # once per tile in each role's tile loop: the producer's TMA coordinates read them too
    assert src.count("const index_t tile_n =") == 2 and src.count("const index_t tile_m =") == 1
    producer = src[src.index("// the elected producer lane") : src.index("cb::setmaxnreg_inc")]
    assert re.search(r"tma_load\(.*\(int\)\(tile_m\)\)", producer), producer
    assert not re.search(r"if \(\(*1 &&", src) and not re.search(r"\w+ \w+\[1\](?: = \{\})?;", src)
    assert not re.search(r"\bj\d+_\d+\b", src)  # no hoisted value left unnamed here
