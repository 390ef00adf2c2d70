"""How the matmul's epilogue stores its outputs (``MatmulParams.store``):

- ``"tma"``: each [64 x en] sub-tile of a warpgroup is written into a
  128-byte swizzled staging tile in shared memory and stored by one TMA copy
  (16-bit outputs whose rows are a multiple of 16 bytes).
- ``"rows"``: the same staging tile, but the warpgroup's threads store it,
  row by row: consecutive threads on consecutive column pairs of one row
  (a warp writes 128 contiguous bytes of a 64-column row), each pair one
  4-byte store where the row's alignment allows it. A 16-bit output with an
  odd N (2047, 50257) has rows that start 4-byte aligned every other row;
  on the others the 4-byte pieces start one element earlier and the tile
  row's first and last elements are stored alone (``cache_before(op="rows")``,
  the lowering's ``cb::row_store2``, which stores under the pair's bounds
  without branching, so that the unrolled row loop keeps several
  iterations' shared loads in flight: on an H200 an odd N's row store
  then runs as an even N's, 28 us at 2047^3 against 23.9 for the TMA
  store at 2048^3). The default for 16-bit outputs a TMA store cannot take:
  an odd N, or an even N whose rows are not 16 bytes apart (2046, 4098).
- ``"direct"``: from the accumulator fragments' registers straight to global
  memory (a pair per store where N is even: rows 4-byte aligned; otherwise
  one element, a warp instruction touching 8 rows).

The staging tile is [W][64][en], swizzled across its 16-byte chunks
(``en x 2`` bytes a row: 128, 64 or 32), so that neither the fragment
writes (8 rows x 16 bytes per warp instruction) nor the row reads (a warp
along one row) conflict on shared-memory banks.
"""

from __future__ import annotations

from ..ir import CircbufError, ParallelType

STORES = ("tma", "rows", "direct")
ROW_COLUMNS = (64, 32, 16)
ROW_UNROLL = 4  # row iterations of a row store unrolled at a time  # sub-tile widths a row store takes (16-bit: 128-, 64-, 32-byte swizzled rows)


def _rows_refused(fusion, role, info=None) -> str | None:
    """Why the outputs cannot be stored by rows from a staging tile, else None.
    A row is contiguous in memory: the pieces of a row store are its neighbours."""
    from . import matmul_reduce

    for k, o in enumerate(fusion.outputs):
        if matmul_reduce.partial_source(o) is not None:
            continue  # (a row reduction's partials: stored by their own loop)
        if o.dtype.size != 2:
            return f"output {o.name} is {o.dtype.name} (the row store takes 16-bit outputs)"
        if fusion.consumers(o):
            return f"output {o.name} is read again by the epilogue"
        if o.domain.allocation_order()[-1] != o.ndim - 1:
            return f"output {o.name}'s last axis is not innermost in memory (its stride order)"
        j = fusion.aliases.get(k)
        if j is not None and info is not None:
            t = info.tensors[j]
            if t.sizes[-1] > 1 and t.strides[-1] != 1:
                return f"output {o.name} is written into {fusion.inputs[j].name}, whose rows are strided {t.strides}"
    if role:
        return "epilogue='role' (its warpgroup stores from registers)"
    return None


def choose_store(fusion, ov, n, bn, epi, tma_ok, role, info=None) -> tuple:
    """``(store, epilogue_tile)``: the ``store`` override checked (a CircbufError
    names why a value cannot apply), else ``"tma"`` where a TMA store can take
    every output, ``"rows"`` for 16-bit outputs it cannot take, else
    ``"direct"``. A row store's default sub-tile is the widest of 64, 32, 16
    columns dividing bn."""
    store = ov.get("store")
    if store is not None and store not in STORES:
        raise CircbufError(f"schedule(store={store!r}): must be one of 'tma', 'rows', 'direct'")
    why = _rows_refused(fusion, role, info)
    if store == "tma" and not tma_ok:
        raise CircbufError(
            "schedule(store='tma'): a TMA store needs 16- or 32-bit row-major outputs, not written into "
            f"an input, whose rows are a multiple of 16 bytes (N = {n}), and sub-tiles of one 128-byte "
            f"row (64 columns of a 16-bit type, 32 of fp32; epilogue_tile={tuple(epi)})"
        )
    if store == "rows" and why is not None:
        raise CircbufError(f"schedule(store='rows'): {why}")
    if store is None:
        # (a sub-tile width a row store cannot take, asked for: the registers' store)
        fits = "epilogue_tile" not in ov or epi[1] in ROW_COLUMNS
        store = "tma" if tma_ok else "rows" if why is None and fits else "direct"
    if store == "rows":
        if "epilogue_tile" not in ov:
            epi = (64, next(c for c in ROW_COLUMNS if bn % c == 0))
        if epi[1] not in ROW_COLUMNS:
            raise CircbufError(
                f"schedule(store='rows', epilogue_tile={tuple(epi)}): a row store's sub-tile is 64, 32 or 16 "
                "columns (one swizzled row of 128, 64 or 32 bytes)"
            )
    return store, tuple(epi)


def staging_bytes(store, buffers, en, sizes) -> int:
    """Shared memory of the staging tiles: [buffers][2 warpgroups][64][en] per
    output (``sizes``: their element sizes in bytes)."""
    return buffers * 2 * 64 * en * sum(sizes) if store in ("tma", "rows") else 0


def rows_layout(tv, m64, n, en):
    """An output stored by rows: its sub-tile axes [M64{64}, Nn{en}] at ``m64``
    become [I{64 / P}, TIDx{128}, V{2}]: the warpgroup's 128 threads cover P
    rows of en / 2 column pairs each (a warp: one 64-column row, two
    32-column rows, ...), I walks the sub-tile's rows, V is one pair."""
    lanes = en // 2
    tv.split(n, 2)  # [M64, L, V]
    tv.split(m64, 128 // lanes)  # [I, P, L, V]
    tv.merge(m64 + 1)  # [I, P*L, V]
    tv.axis(m64 + 1).parallelize(ParallelType.TIDx)
    tv.axis(m64 + 2).parallelize(ParallelType.Vectorize)
    if 64 // (128 // lanes) > ROW_UNROLL:
        # 16 row iterations unrolled whole, each with its addresses, spilled 12 registers
        # beside the accumulators of a 128x256 bias + gelu tile (SASS, sm_90a); 4 did not
        tv.axis(m64).unroll(ROW_UNROLL)
