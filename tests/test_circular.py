"""Circular buffering and TMA, on the CPU: the API's rules, the lowered
pipeline's structure, the SASS it compiles to, the tensor-map rules, and the
scheduler's choice between the TMA and plain paths."""

import re

import pytest
import torch

import circbuf as cb
from circbuf.ir import ParallelType, evaluate
from circbuf.lowering.kir import (
    BlockSync,
    ForLoop,
    MBarrierAlloc,
    MBarrierArrive,
    MBarrierArriveExpectTx,
    MBarrierInit,
    MBarrierWait,
    TmaLoad,
    walk,
)
from circbuf.runtime.tensormap import check_map
from circbuf.scheduler import propagate_transforms
from tests.util import D, manual_ws_exp, norm_fusion, norm_inputs


def nodes(kernel, kind):
    out = []
    walk(kernel.body, lambda n, s: out.append(n) if isinstance(n, kind) else None)
    return out


def compile_norm(kind="softmax", rows=4096, cols=4096, dtype=torch.bfloat16, **overrides):
    fd = norm_fusion(kind, {torch.bfloat16: D.BFloat16, torch.float32: D.Float, torch.float16: D.Half}[dtype])
    if overrides:
        fd.fusion.schedule(**overrides)
    return fd.compile(norm_inputs(kind, rows, cols, dtype, "cpu"), arch="sm_90a")


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("war", ["block_sync", "mbarrier"])
def test_pipelined_structure(stages, war):
    from circbuf.lowering.kir import RingAdvance, RingInit

    ck = compile_norm(stages=stages, war=war)
    p = ck.params
    assert type(p).__name__ == "NormalizationParams" and p.stages == stages and p.prefetch == stages - 1
    k = ck.kernel
    allocs = nodes(k, MBarrierAlloc)
    assert [a.count for a in allocs] == [stages] * (2 if war == "mbarrier" else 1)
    inits = nodes(k, MBarrierInit)
    assert len(inits) == stages * len(allocs)
    # two sides of one ring: the copies' position and the readers', each a
    # stage index and a phase bit declared once, at the top of the kernel
    rings = {r.ring.name: r.ring for r in nodes(k, RingInit)}
    load, use = rings[f"{allocs[0].name[:-5]}_load"], rings[f"{allocs[0].name[:-5]}_use"]
    assert load.stages == use.stages == stages
    top = [n for n in k.body if isinstance(n, ForLoop)]
    if stages == 2:  # a prologue of one trip (prefetch 1) is its body: the one_trip pass
        (main,) = top
    else:
        prologue, main = top
        assert prologue.extent.value == stages - 1  # prefetch distance
    assert main.strided  # the persistent row loop: blockIdx.x .. rows, step gridDim.x
    waits = nodes(k, MBarrierWait)
    full_wait = [w for w in waits if w.bar.name.endswith("_full")]
    assert len(full_wait) == 1 and full_wait[0] in main.body
    assert full_wait[0].bar.stage == use.stage and full_wait[0].parity == use.phase
    # two issue sites (prologue, main loop), each announcing its bytes and advancing the copies' side
    assert len(nodes(k, MBarrierArriveExpectTx)) == 2 and len(nodes(k, TmaLoad)) == 2
    advances = nodes(k, RingAdvance)
    assert sorted(a.ring.name for a in advances) == sorted([load.name, load.name, use.name])
    assert main.body[-1].ring is use  # the readers move on once per iteration, last
    if war == "mbarrier":
        empty_wait = [w for w in waits if w.bar.name.endswith("_empty")]
        assert len(empty_wait) == 2 and len(nodes(k, MBarrierArrive)) == 1
        for w in empty_wait:
            # the slot the copies refill: wait for the phase before the one the
            # readers wait for at the same position (a fresh barrier passes it)
            assert w.bar.stage == load.stage and str(w.parity) == f"({load.phase} ^ 1)"
        # as numbers: at ring position q both sides stand at stage q % S with
        # phase (q / S) % 2 (each advances once per position); the copies wait
        # for empty[] in the phase before the readers' full[] wait, which a
        # fresh barrier has passed for the first S positions
        (fw,) = full_wait
        for q in range(4 * stages):
            ph = (q // stages) % 2
            for w in empty_wait:
                assert evaluate(w.parity, {load.phase.name: ph}) == 1 - evaluate(
                    fw.parity, {use.phase.name: ph}
                )
    else:
        syncs = [k for k, n in enumerate(main.body) if isinstance(n, BlockSync) and "WAR" in n.reason]
        assert len(syncs) == 1
    # rows held in registers: the stage is released right after the copy to
    # registers, before the first reduction of the row
    assert p.row_length == 4096
    kinds = [type(n).__name__ for n in main.body]
    release = "MBarrierArrive" if war == "mbarrier" else "BlockSync"
    assert kinds.index(release) < kinds.index("BlockReduce")


def test_tma_sass_and_no_local_memory():
    ck = compile_norm("layer_norm", 1024, 8192, staging="tma")
    sass = ck.sass()
    for op in ("UTMALDG", "SYNCS.ARRIVE.TRANS", "SYNCS.PHASECHK.TRANS", "LDS.128", "STG.E.128"):
        assert op in sass, op
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0
    assert "cb::tma_load(&" in ck.cuda and "CUtensorMap tmap0" in ck.cuda


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("cols", [8, 1000, 4104, 16384])
def test_norm_tma_kernels_compile(kind, cols):
    ck = compile_norm(kind, 513, cols, staging="tma")
    assert type(ck.params).__name__ == "NormalizationParams"
    assert "UTMALDG" in ck.sass()
    assert ck.resource_usage()["LOCAL"] == 0


def test_rows_in_registers_override_and_its_deprecated_name():
    import warnings

    assert compile_norm().params.row_length == 4096  # default: short rows are kept in registers
    assert compile_norm(rows_in_registers=False).params.row_length == 0
    fd = norm_fusion("softmax", D.BFloat16)
    with pytest.warns(DeprecationWarning, match="override registers is now rows_in_registers") as w:
        fd.fusion.schedule(registers=False)
    assert w[0].filename == __file__  # the warning points at the caller's schedule() line
    assert fd.fusion.schedule_overrides == {"rows_in_registers": False}
    ck = fd.compile(norm_inputs("softmax", 4096, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    assert ck.params.row_length == 0
    with pytest.raises(cb.CircbufError, match="registers is the old name of rows_in_registers"):
        fd.fusion.schedule(registers=False, rows_in_registers=True)
    # a Fusion not built by a FusionDefinition: renamed (and warned about) at compile
    fd = norm_fusion("softmax", D.BFloat16)
    fd.fusion.check_overrides = None
    fd.fusion.schedule(registers=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ck = fd.compile(norm_inputs("softmax", 4096, 4096, torch.bfloat16, "cpu"), arch="sm_90a")
    assert ck.params.row_length == 0 and any(issubclass(x.category, DeprecationWarning) for x in w)


def test_scheduler_falls_back_when_tma_cannot_describe_the_input():
    # a bf16 row of 1001 elements: row stride 2002 bytes is not a multiple of 16
    assert type(compile_norm(cols=1001).params).__name__ == "ReductionParams"
    # too long for shared memory: plain path
    assert type(compile_norm(rows=4, cols=131072).params).__name__ == "ReductionParams"
    # forced off
    assert type(compile_norm(tma=False).params).__name__ == "ReductionParams"
    # misaligned pointer
    fd = norm_fusion("softmax", D.BFloat16)
    x = torch.randn(64 * 1024 + 8, dtype=torch.bfloat16)[1:].view(-1)[: 64 * 1024].view(64, 1024)
    assert type(fd.compile([x], arch="sm_90a").params).__name__ == "ReductionParams"


def tma_fusion():
    with cb.FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=D.BFloat16)
        y = fd.ops.cast(fd.ops.exp(x), D.BFloat16)
        fd.add_output(y)
    return fd, x, y


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda xs: xs.circular_buffer(1), "stages must be an int >= 2"),
        (lambda xs: xs.circular_buffer(3, prefetch=3), "prefetch must satisfy 0 < prefetch < stages"),
        (lambda xs: xs.circular_buffer(3, prefetch=0), "prefetch must satisfy"),
        (lambda xs: xs.circular_buffer(2, type="fast"), "type must be Pipelined"),
    ],
)
def test_invalid_circular_buffer_calls(call, match):
    fd, x, y = tma_fusion()
    xs = x.cache_after(op="tma")
    y.split(0, 4)
    propagate_transforms(fd.fusion, y)
    xs.inline_at(1)
    with pytest.raises(cb.CircbufError, match=match):
        call(xs)


def test_circular_buffer_needs_shared_tma_and_a_serial_loop():
    fd, x, y = tma_fusion()
    xl = x.cache_after()
    with pytest.raises(cb.CircbufError, match="must be in shared memory"):
        xl.circular_buffer(2)
    xl.set_memory_type(cb.MemoryType.Shared)
    xl.inline_at(1)
    with pytest.raises(cb.CircbufError, match="warp-specialized buffer must be filled by TMA"):
        xl.circular_buffer(2, type=cb.WarpSpecialized())
    fd2, x2, y2 = tma_fusion()
    xs = x2.cache_after(op="tma")
    with pytest.raises(cb.CircbufError, match="no serial loop left of its compute-at position"):
        xs.circular_buffer(2)
    y2.axis(0).parallelize(ParallelType.BIDx)
    propagate_transforms(fd2.fusion, y2)
    xs.inline_at(1)
    with pytest.raises(cb.CircbufError, match="no serial loop"):
        xs.circular_buffer(2)
    with pytest.raises(cb.CircbufError, match="bulk .* constant extent in \\[1, 256\\]"):
        xs.axis(1).parallelize(ParallelType.Bulk)
    with pytest.raises(cb.CircbufError, match="WarpSpecialized\\(registers=\\(41, 232\\)\\)"):
        cb.WarpSpecialized(registers=(41, 232))
    with pytest.raises(cb.CircbufError, match="WarpSpecialized\\(registers=232\\): two multiples of 8"):
        cb.WarpSpecialized(registers=232)  # not a pair: named, not a TypeError
    with pytest.raises(cb.CircbufError, match="war must be"):
        cb.Pipelined(war="sometimes")


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(ptr=8), "global address 0x8 is not 16-byte aligned"),
        (dict(gstrides=[2, 2002]), r"globalStride\[1\] = 2002 bytes is not a multiple of 16"),
        (dict(gstrides=[2, 1 << 41]), r"globalStride\[1\] = .* is not below 2\^40"),
        (dict(dims=[0, 4]), r"globalDim\[0\] = 0 not in \[1, 2\^32\]"),
        (dict(box=[300, 1]), r"boxDim\[0\] = 300 not in \[1, 256\]"),
        (dict(box=[4, 1]), r"boxDim\[0\] x element size = 8 bytes is not a multiple of 16"),
        (dict(dims=[1] * 6, gstrides=[2] + [16] * 5, box=[8] + [1] * 5), r"rank 6 not in \[1, 5\]"),
        (dict(gstrides=[4, 64]), "innermost dimension must be contiguous"),
    ],
)
def test_tensor_map_rules_are_named(args, match):
    kw = dict(ptr=0x1000, dims=[1024, 64], gstrides=[2, 2048], box=[256, 2])
    kw.update(args)
    with pytest.raises(cb.CircbufError, match=match):
        check_map("T0", kw["ptr"], kw["dims"], kw["gstrides"], kw["box"], 2)


def test_debug_hang_knob_bounds_every_wait(monkeypatch):
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", "1000")
    ck = compile_norm(staging="tma")
    assert "cb::mbar_wait_bounded(" in ck.cuda and "unsigned* cb_hang" in ck.cuda
    assert not re.search(r"cb::mbar_wait\(", ck.cuda.split("end of prelude")[1])


def test_warp_specialized_structure():
    from circbuf.lowering.kir import ElectOne, Return, RoleSwitch

    ck = compile_norm("layer_norm", 4096, 4096, stages=3, warp_specialized=True)
    assert ck.params.warp_specialized
    k = ck.kernel
    y = ck.params.rows
    assert k.launch[ParallelType.TIDy].value == y + 1  # the producer row
    roles = [n for n in k.body if isinstance(n, RoleSwitch)]
    assert len(roles) == 1 and [r.name for r in roles[0].roles] == ["producer", "consumers"]
    producer = roles[0].bodies[0]
    assert isinstance(producer[-1], Return)
    prod_loads = []
    walk(producer, lambda n, s: prod_loads.append((n, s)) if isinstance(n, TmaLoad) else None)
    assert len(prod_loads) == 1 and all(isinstance(x, (ForLoop, ElectOne)) for x in prod_loads[0][1])
    assert not [n for n in nodes(k, TmaLoad) if n not in [p for p, _ in prod_loads]]  # consumers issue none
    waits = nodes(k, MBarrierWait)
    assert {w.bar.name.rsplit("_", 1)[1] for w in waits} == {"full", "empty"}
    assert len(nodes(k, MBarrierArrive)) == 1
    bar = k.named_barriers["consumers"][0]  # allocated by the compiler, not hard-coded
    assert "bar.sync" in ck.cuda and "cb::block_reduce_x(" in ck.cuda and f", {bar}, " in ck.cuda
    sass = ck.sass()
    assert "UTMALDG" in sass and "BAR.SYNC" in sass
    assert ck.resource_usage()["LOCAL"] == 0


@pytest.mark.parametrize("hang", ["", "2000000"])
def test_warp_specialized_with_setmaxnreg_compiles(monkeypatch, hang):
    """With and without the bounded waits of CIRCBUF_DEBUG_HANG (scripts/gpu_check.sh sets it):
    a bounded wait that was a function call failed ptxas under setmaxnreg (C7600)."""
    monkeypatch.setenv("CIRCBUF_DEBUG_HANG", hang)
    fd = manual_ws_exp(128, 4)
    ck = fd.compile([torch.randn(256, 512, dtype=torch.bfloat16)], arch="sm_90a")
    sass = ck.sass()
    assert "USETMAXREG" in sass and "UTMALDG" in sass
    assert "__launch_bounds__(384, 1)" in ck.cuda
    # an outer loop and the buffered loop share one ring: the stage is a variable
    # that runs on across the outer loop, advanced once per copy / per read
    wait = "cb::mbar_wait_bounded(" if hang else "cb::mbar_wait("
    assert wait + "&x_full[x_use_stage], (unsigned)(x_use_phase)" in ck.cuda
    assert ck.cuda.count("if (++x_use_stage == 4) { x_use_stage = 0; x_use_phase ^= 1; }") == 1
    assert ck.cuda.count("if (++x_load_stage == 4) { x_load_stage = 0; x_load_phase ^= 1; }") == 1
    assert ck.resource_usage()["LOCAL"] == 0 and ck.resource_usage()["STACK"] == 0
    # setmaxnreg acts on warpgroups: a 64-thread row is refused by name
    fd2 = manual_ws_exp(64, 4)
    with pytest.raises(cb.CircbufError, match="whole warpgroups"):
        fd2.compile([torch.randn(256, 512, dtype=torch.bfloat16)], arch="sm_90a")


def test_pointwise_tma_variant_structure_and_fallbacks():
    from tests.util import axpy_fusion

    fd = axpy_fusion(D.BFloat16, 2)
    fd.fusion.schedule(stages=3)
    ck = fd.compile([torch.randn(1000, 1024, dtype=torch.bfloat16)] * 2, arch="sm_90a")
    assert type(ck.params).__name__ == "PointwiseTmaParams" and ck.params.stages == 3
    assert len(ck.kernel.tensor_maps) == 2 and len(nodes(ck.kernel, MBarrierAlloc)) == 2
    sass = ck.sass()
    for op in ("UTMALDG", "LDS.128", "STG.E.128", "SYNCS.PHASECHK.TRANS"):
        assert op in sass, op
    use = ck.resource_usage()
    assert use["STACK"] == 0 and use["LOCAL"] == 0
    # not asked for, rank 1, or a row stride of 2002 bytes: the plain kernel, the params say why
    plain = axpy_fusion(D.BFloat16, 2)
    assert type(
        plain.compile([torch.randn(64, 1024, dtype=torch.bfloat16)] * 2, arch="sm_90a").params
    ).__name__ == ("PointwiseParams")
    for shape, why in (((4096,), "1-D fusion has no rows"), ((64, 1001), "row stride 2002 bytes")):
        f = axpy_fusion(D.BFloat16, len(shape))
        f.fusion.schedule(stages=3)
        p = f.compile([torch.randn(*shape, dtype=torch.bfloat16)] * 2, arch="sm_90a").params
        assert type(p).__name__ == "PointwiseParams" and why in p.tma_declined
    # tma=False asks for the plain kernel, which has no ring: stages=3 is not used
    f = axpy_fusion(D.BFloat16, 2)
    f.fusion.schedule(stages=3, tma=False)
    with pytest.raises(
        cb.CircbufError, match=r"schedule\(stages=3\): the kernel chosen, pointwise \(plain\)"
    ):
        f.compile([torch.randn(64, 1024, dtype=torch.bfloat16)] * 2, arch="sm_90a")


@pytest.mark.parametrize("ws", [False, True])
def test_pointwise_tma_warp_specialized_compiles(ws):
    from tests.util import axpy_fusion

    fd = axpy_fusion(D.Half, 3)
    fd.fusion.schedule(stages=4, warp_specialized=ws)
    ck = fd.compile([torch.randn(3, 77, 512, dtype=torch.float16)] * 2, arch="sm_90a")
    assert ck.params.warp_specialized == ws
    assert ck.resource_usage()["STACK"] == 0 and "UTMALDG" in ck.sass()


def test_pointwise_tma_store_structure_and_sass(monkeypatch):
    from circbuf.lowering.kir import BulkCommitGroup, BulkWaitGroup, ElectOne, Fence, TmaStore
    from tests.util import axpy_fusion

    monkeypatch.delenv("CIRCBUF_DEBUG_HANG", raising=False)  # its hang record is written with STG
    fd = axpy_fusion(D.BFloat16, 2)
    fd.fusion.schedule(stages=3, tma_store=True)
    ck = fd.compile([torch.randn(1000, 1024, dtype=torch.bfloat16)] * 2, arch="sm_90a")
    assert ck.params.tma_store and len(ck.kernel.tensor_maps) == 3
    (store,) = nodes(ck.kernel, TmaStore)
    assert store.box_bytes == 16 * 256 * 2 and len(store.coords) == 2
    elected = nodes(ck.kernel, ElectOne)
    assert any(store in e.then and isinstance(e.then[-1], BulkCommitGroup) for e in elected)
    waits = nodes(ck.kernel, BulkWaitGroup)
    assert [(w.pending, w.read) for w in waits] == [(0, True), (0, False)]
    assert [f.kind for f in nodes(ck.kernel, Fence)].count("proxy_async") == 1
    # in the tile loop: wait until the last store has read the tile, sync, write,
    # fence, one sync (merged with the stages' release), then store
    (loop,) = [
        n
        for n in nodes(ck.kernel, ForLoop)
        if any(store in e.then for e in n.body if isinstance(e, ElectOne))
    ]
    kinds = [type(n).__name__ for n in loop.body]
    assert kinds[-5:] == [
        "Fence",
        "BlockSync",
        "ElectOne",
        "RingAdvance",
        "RingAdvance",
    ]  # one ring per input
    assert kinds.count("BlockSync") == 2
    sass = ck.sass()
    for op in ("UTMASTG", "UTMACMDFLUSH", "DEPBAR.LE", "FENCE.VIEW.ASYNC.S", "ELECT", "STS.128"):
        assert op in sass, op
    assert not re.search(r"\bSTG\.", sass)  # every output byte leaves through the TMA store
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0


def test_tma_store_rules():
    from tests.util import manual_tma_store

    x = torch.randn(64, 96)
    ck = manual_tma_store().compile([x], arch="sm_90a")
    assert "cb::tma_store(&tmap0, &out_stage[0]" in ck.cuda and "UTMASTG" in ck.sass()
    with pytest.raises(cb.CircbufError, match="must lie densely, row-major"):
        manual_tma_store(transposed=True).compile([x], arch="sm_90a")
    fd, x_, y = tma_fusion()
    with pytest.raises(cb.CircbufError, match="must be a global fusion output"):
        fd.fusion.exprs()[0].out.cache_before(op="tma")
    with pytest.raises(cb.CircbufError, match="op='bulk' is not supported"):
        y.cache_before(op="bulk")
    # an output row of 1001 x 2 bytes cannot be stepped by a tensor map: plain stores
    from tests.util import axpy_fusion

    f = axpy_fusion(D.BFloat16, 2)
    f.fusion.schedule(stages=3, tma_store=True)
    p = f.compile([torch.randn(64, 1001, dtype=torch.bfloat16)] * 2, arch="sm_90a").params
    assert type(p).__name__ == "PointwiseParams" and "stride" in p.tma_declined


def test_outer_reduction_tma_structure_and_sass():
    from circbuf.lowering.kir import BlockReduce
    from tests.util import outer_fusion

    fd = outer_fusion("sum")
    ck = fd.compile([torch.randn(8192, 4096, dtype=torch.bfloat16)], arch="sm_90a")
    p = ck.params
    assert type(p).__name__ == "OuterReductionParams", p
    assert p.tile_rows % p.threads_y == 0 and (p.cols * p.threads_y) % 32 == 0
    (br,) = nodes(ck.kernel, BlockReduce)
    assert br.ptypes == (ParallelType.TIDy,) and br.threads == p.threads_y
    loads = nodes(ck.kernel, TmaLoad)  # the prologue's and the main loop's
    assert len(loads) == 2 and all(ld.box_bytes == p.tile_rows * p.cols * 2 for ld in loads)
    assert [b for _, b in ck.kernel.tensor_maps[0].dims] == [p.cols, p.tile_rows]
    # one column per thread, accumulated over the ring; the rows of threads combine once
    assert f"cb::block_reduce_y<{p.threads_y}>(" in ck.cuda
    sass = ck.sass()
    for op in ("UTMALDG", "SYNCS.PHASECHK.TRANS"):
        assert op in sass, op
    use = ck.resource_usage()
    assert use["LOCAL"] == 0 and use["STACK"] == 0


@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize(
    "op, shape, axes, weight",
    [
        ("max", (100, 3, 264), (0,), False),
        ("mean", (4, 100, 264), (0, 1), False),
        ("sum", (999, 136), (0,), True),
    ],
)
def test_outer_reduction_variants_compile(op, shape, axes, weight, ws):
    from tests.util import outer_fusion

    fd = outer_fusion(op, D.Half, len(shape), axes, weight)
    fd.fusion.schedule(stages=3, warp_specialized=ws)
    ins = [torch.randn(*shape, dtype=torch.float16)]
    if weight:
        ins.append(torch.randn(*shape[len(axes) :], dtype=torch.float16))
    ck = fd.compile(ins, arch="sm_90a")
    assert type(ck.params).__name__ == "OuterReductionParams" and ck.params.warp_specialized == ws
    assert "UTMALDG" in ck.sass() and ck.resource_usage()["LOCAL"] == 0


def test_outer_reduction_falls_back_to_the_plain_path():
    from tests.util import outer_fusion

    def kind(fd, *ins, **ov):
        if ov:
            fd.fusion.schedule(**ov)
        return type(fd.compile(list(ins), arch="sm_90a").params).__name__

    x = torch.randn(512, 1024, dtype=torch.bfloat16)
    assert kind(outer_fusion("sum"), x) == "OuterReductionParams"
    assert kind(outer_fusion("sum"), x, tma=False) == "ReductionParams"
    # a row of 1001 x 2 bytes cannot be stepped by a tensor map
    assert kind(outer_fusion("sum"), torch.randn(512, 1001, dtype=torch.bfloat16)) == "ReductionParams"
    # two passes over the rows (the variance reads the mean): not single-pass
    with cb.FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=D.Float)
        v, m = fd.ops.var_mean(t, [0])
        fd.add_output(v)
        fd.add_output(m)
    assert kind(fd, torch.randn(512, 1024)) == "ReductionParams"
    with pytest.raises(cb.CircbufError, match="cols=20"):
        kind(outer_fusion("sum"), x, cols=20, stages=2)
