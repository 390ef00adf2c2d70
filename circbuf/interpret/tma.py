"""Where the bytes of bulk tensor copies and wgmma operands lie.

A tensor map (:class:`~circbuf.lowering.kir.TensorMapSpec`, encoded by the
runtime as :func:`circbuf.runtime.tensormap.map_geometry` says) moves a box
of ``box[0] x box[1] x ...`` elements (innermost first) between global
memory at integer coordinates and shared memory, where the box lies dense,
innermost fastest, from the copy's address. Out-of-range elements read as
zero and are not written. The shared side's 32/64/128-byte swizzle XORs the
16-byte chunk bits [4, 7) of each shared byte address with its bits [7, 10)
(CUTLASS's Swizzle<B, 4, 3>), on the absolute address as the hardware does
(buffers start on 1024-byte boundaries, so an offset from the buffer is the
address modulo 1024).

A wgmma operand is read through a matrix descriptor: K-major (``transpose``
false) rows of MN are ``swizzle`` bytes apart, groups of 8 rows ``sbo``
bytes; MN-major chunks of ``swizzle / size`` MN elements are ``lbo`` bytes
apart, K rows ``swizzle`` bytes, groups of 8 K rows ``sbo`` bytes; the
swizzle applies to the computed address.

>>> swizzle(0x80 + 0x10, 128) == 0x80 + 0x00   # row 1: chunk 1 XOR 1
True
>>> [swizzle(a, 64) for a in (0, 16, 128, 128 + 16, 256)]
[0, 16, 144, 128, 288]
"""

from __future__ import annotations

import itertools

from ..ir import CircbufError


def swizzle(addr: int, nbytes: int) -> int:
    """Byte address ``addr`` after the ``nbytes`` swizzle (0: none)."""
    if not nbytes:
        return addr
    return addr ^ (((addr >> 7) & (nbytes // 16 - 1)) << 4)


class MapGeometry:
    """One tensor map over one tensor: global extents, element strides and
    the box, innermost first; the box's element offsets precomputed."""

    def __init__(self, spec, shape, strides, itemsize, name):
        from ..runtime.tensormap import map_geometry

        dims, gstrides, box = map_geometry(spec, list(shape), list(strides), itemsize)
        self.spec, self.name, self.itemsize = spec, name, itemsize
        self.dims = dims
        self.strides = [s // itemsize for s in gstrides]
        self.box = box
        self.swizzle = spec.swizzle
        n = 1
        for b in box:
            n *= b
        self.elems = n
        self.nbytes = n * itemsize
        # per box element (innermost fastest): its offsets along each dim and in global memory
        ranges = [range(b) for b in reversed(box)]
        self.coords = [tuple(reversed(c)) for c in itertools.product(*ranges)]
        self.rel = [sum(b * s for b, s in zip(c, self.strides)) for c in self.coords]
        self._smem: dict = {}

    def global_index(self, coords) -> list:
        """The global element offset of each box element at ``coords``, or -1
        where it lies outside the tensor. Coordinates the hardware refuses
        raise (:func:`circbuf.runtime.tensormap.check_coords`)."""
        from ..runtime.tensormap import check_coords

        if len(coords) != len(self.dims):
            raise CircbufError(
                f"tensor map of {self.name}: {len(coords)} coordinates for {len(self.dims)} dims"
            )
        check_coords(self.name, coords)
        base = sum(c * s for c, s in zip(coords, self.strides))
        if all(c >= 0 and c + b <= d for c, b, d in zip(coords, self.box, self.dims)):
            return [base + r for r in self.rel]
        out = []
        for bc, r in zip(self.coords, self.rel):
            inside = all(0 <= c + b < d for c, b, d in zip(coords, bc, self.dims))
            out.append(base + r if inside else -1)
        return out

    def smem_index(self, start_byte: int, base_byte: int, elem_size: int) -> list:
        """The element of a shared buffer (starting at byte ``base_byte`` of
        the 1024-byte aligned shared memory) holding each box element, the
        copy starting at byte ``start_byte``: dense, then swizzled."""
        key = (start_byte, base_byte, elem_size)
        got = self._smem.get(key)
        if got is None:
            if start_byte % 128:
                raise CircbufError(
                    f"tensor map of {self.name}: a bulk tensor copy's shared address (byte {start_byte}) "
                    "must be 128-byte aligned"
                )
            item, swz = self.itemsize, self.swizzle
            got = [(swizzle(start_byte + e * item, swz) - base_byte) // elem_size for e in range(self.elems)]
            self._smem[key] = got
        return got


def operand_index(op, start_elem: int, base_byte: int, mn: int, k: int, elem_size: int) -> list:
    """Element indices (into the operand's buffer, which starts at byte
    ``base_byte`` of shared memory) of a wgmma operand read through
    descriptor ``op`` (an :class:`~circbuf.lowering.kir.MmaOperand`) at
    element ``start_elem`` of the buffer: ``out[i][j]`` holds (mn i, k j)."""
    swz, lbo, sbo = op.swizzle, op.lbo, op.sbo
    start = base_byte + start_elem * elem_size
    if start % 16:
        raise CircbufError(
            f"{op.tv.name}: a wgmma descriptor's start address (byte {start}) is not 16-byte aligned"
        )
    rows = []
    for i in range(mn):
        row = []
        for j in range(k):
            if not swz:  # interleaved 8 x 16-byte core matrices
                if op.transpose:
                    raise CircbufError(
                        f"{op.tv.name}: an MN-major wgmma operand without swizzle is not interpreted"
                    )
                kb = j * elem_size
                a = start + (i // 8) * sbo + (i % 8) * 16 + (kb // 16) * lbo + kb % 16
            elif not op.transpose:  # K-major
                a = start + (i // 8) * sbo + (i % 8) * swz + j * elem_size
            else:  # MN-major
                span = swz // elem_size
                a = start + (i % span) * elem_size + (i // span) * lbo + (j % 8) * swz + (j // 8) * sbo
            row.append((swizzle(a, swz) - base_byte) // elem_size)
        rows.append(row)
    return rows


def fragment_index(n: int) -> list:
    """The wgmma m64nN accumulator layout: for thread t of the warpgroup
    (warp w, lane l) and register r = 4j + 2h + e, the flat index
    ``row * n + col`` of the element it holds: row 16w + 8h + l / 4, column
    8j + 2(l % 4) + e. ``out[t][r]``."""
    out = []
    for t in range(128):
        w, ln = t // 32, t % 32
        regs = []
        for r in range(n // 2):
            j, h, e = r // 4, (r // 2) % 2, r % 2
            regs.append((16 * w + 8 * h + ln // 4) * n + 8 * j + 2 * (ln % 4) + e)
        out.append(regs)
    return out
