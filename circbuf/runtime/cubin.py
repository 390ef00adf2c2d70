"""What a cubin says about its kernels, read from the ELF file itself (no
driver, no GPU, no cuobjdump): the stack frame ptxas gave each function,
which is where register spills live.

>>> # frame_bytes(compile_cuda(src, "sm_90a"))   # 0: nothing in local memory
"""

from __future__ import annotations

import struct

# .nv.info records (ptxas's EIATTR attributes): one byte of format, one of attribute,
# then a 2-byte value (format 3) or a 2-byte size and that many bytes (format 4)
_EIFMT_HVAL, _EIFMT_SVAL = 3, 4
EIATTR_FRAME_SIZE = 0x11  # (function symbol u32, bytes of stack frame per thread u32)


def _sections(elf: bytes) -> dict:
    """{name: bytes} of an ELF64 little-endian file's sections."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 cubin")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]

    def name(off):
        return elf[names + off : elf.index(b"\0", names + off)].decode()

    return {name(h[0]): elf[h[4] : h[4] + h[5]] for h in heads}


def _records(info: bytes):
    """(attribute, value bytes or a 2-byte int) of an .nv.info section."""
    i = 0
    while i + 4 <= len(info):
        fmt, attr, val = info[i], info[i + 1], struct.unpack_from("<H", info, i + 2)[0]
        if fmt == _EIFMT_SVAL:
            yield attr, info[i + 4 : i + 4 + val]
            i += 4 + val
        else:
            yield attr, (val if fmt == _EIFMT_HVAL else None)
            i += 4


def frame_bytes(cubin: bytes) -> int:
    """The largest stack frame (bytes per thread) of any function in ``cubin``:
    local memory a kernel's registers spilled to, or a local array it indexes at
    run time. 0 when everything lives in registers."""
    out = 0
    for attr, val in _records(_sections(cubin).get(".nv.info", b"")):
        if attr == EIATTR_FRAME_SIZE and isinstance(val, bytes) and len(val) == 8:
            out = max(out, struct.unpack_from("<I", val, 4)[0])
    return out
