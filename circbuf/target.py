"""The GPU a kernel is built for: one table of hardware limits that the
schedulers and lowering read (no hardware constant is written anywhere else).

A compile with no GPU (``fd.compile(inputs, arch="sm_90a")``) is for
:data:`DEFAULT` (an H100 SXM); ``execute`` builds the target of the device its
inputs live on, once per device (:func:`Target.from_device`); ``fd.compile(...,
target=H200)`` picks one explicitly.

>>> print(H100)
Target H100 SXM (sm_90a): 132 SMs
  threads: 1024 per block, 2048 per SM
  shared memory: 232448 bytes per block (opt-in), 233472 per SM
  registers: 65536 per SM, 255 per thread
  L2 50 MB; memory 3.35 TB/s peak, 3.00 TB/s measured copy (22.7 GB/s per SM)
>>> H200.copy_bandwidth / H100.copy_bandwidth
1.4
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from .ir import CircbufError

# A GPU missing from KNOWN: its measured copy bandwidth is taken as this fraction of the
# peak its memory clock and bus width give (H100 SXM: 3.00 of 3.35 TB/s; H200: 4.2 of 4.8)
COPY_FRACTION = 0.9


@dataclass(frozen=True)
class Target:
    """Limits of one GPU. Bandwidths in bytes per second (a copy's bytes read + written)."""

    name: str
    arch: str  # NVRTC's cubin target: sm_90a (wgmma, setmaxnreg) on compute capability 9.0
    sm_count: int
    smem_per_block: int  # opt-in dynamic shared memory limit per block, bytes
    smem_per_sm: int  # shared memory per SM, bytes (what CTAs resident together share)
    registers_per_sm: int  # 32-bit registers
    registers_per_thread: int  # the most one thread may use
    max_threads_per_block: int
    max_threads_per_sm: int
    l2_bytes: int
    peak_bandwidth: float  # DRAM, from the datasheet (or memory clock x bus width)
    copy_bandwidth: float  # a device-to-device copy, measured (what a streaming kernel can reach)
    max_grid_yz: int = 65535  # gridDim.y and gridDim.z
    max_cluster_size: int = 8  # CTAs of a thread-block cluster (8: the portable limit on sm_90)
    # (cluster size, CTAs of such clusters resident at once): a cluster's CTAs share one GPC,
    # and the H100 SXM's 8 GPCs of 16 or 18 SMs hold 66 clusters of 2, 32 of 4 (128 CTAs) and
    # 15 of 8 (120; accel-sim's SM->GPC map of an H100); not measured here: checked against
    # cuOccupancyMaxActiveClusters by tests/test_gpu_cluster.py
    # CTAs of clusters of that size resident at once; 4: cuOccupancyMaxActiveClusters gave 30
    # for the 128x256 cooperative kernel on an H100 (tests/test_gpu_cluster.py), not 32
    cluster_residency: tuple = ((2, 132), (4, 120), (8, 120))

    def registers_at(self, threads: int) -> int:
        """Registers per thread when ``threads`` share an SM (``__launch_bounds__`` of
        those threads in all): the SM's registers / threads, down to a multiple of 8,
        as ptxas allocates (168 on Hopper for 384, 48 for 5 CTAs of 256).

        >>> H100.registers_at(384)
        168
        """
        return self.registers_per_sm // threads // 8 * 8

    def cluster_slots(self, size: int) -> int:
        """CTAs of clusters of ``size`` that can run at once: a persistent grid's cap
        (a cluster past it would wait for a whole cluster to finish, a second wave)."""
        whole = self.sm_count // size * size
        return min(whole, dict(self.cluster_residency).get(size, whole))

    @property
    def bandwidth_per_sm(self) -> float:
        """Measured copy bandwidth that one SM's share of the grid can draw, bytes/s."""
        return self.copy_bandwidth / self.sm_count

    def bytes_in_flight(self, latency_s: float) -> int:
        """Little's law: the bytes each SM must have requested and not yet received to
        keep its share of the copy bandwidth busy over a load latency of ``latency_s``."""
        return round(self.bandwidth_per_sm * latency_s)

    def __str__(self):
        return (
            f"Target {self.name} ({self.arch}): {self.sm_count} SMs\n"
            f"  threads: {self.max_threads_per_block} per block, {self.max_threads_per_sm} per SM\n"
            f"  shared memory: {self.smem_per_block} bytes per block (opt-in), {self.smem_per_sm} per SM\n"
            f"  registers: {self.registers_per_sm} per SM, {self.registers_per_thread} per thread\n"
            f"  L2 {self.l2_bytes / 2**20:.0f} MB; memory {self.peak_bandwidth / 1e12:.2f} TB/s peak, "
            f"{self.copy_bandwidth / 1e12:.2f} TB/s measured copy ({self.bandwidth_per_sm / 1e9:.1f} GB/s per SM)"
        )

    # ------------------------------------------------------------ from a device
    @staticmethod
    def from_props(props) -> Target:
        """The target of a device described by ``props`` (torch's
        ``torch.cuda.get_device_properties``: name, major, minor,
        multi_processor_count, shared_memory_per_block_optin, ...). Limits come from
        the device; the measured copy bandwidth from :data:`KNOWN` when the name
        matches an entry, else :data:`COPY_FRACTION` of the peak its memory gives."""
        known = next((t for key, t in KNOWN.items() if key in props.name), None)
        base = known or DEFAULT

        def get(attr, fallback):
            v = getattr(props, attr, None)
            return v if isinstance(v, int) and v > 0 else fallback

        clock_khz, bus_bits = get("memory_clock_rate", 0), get("memory_bus_width", 0)
        # double data rate: two transfers per clock over bus_bits / 8 bytes
        peak = clock_khz * 1e3 * 2 * bus_bits / 8 if clock_khz and bus_bits else base.peak_bandwidth
        return dataclasses.replace(
            base,
            name=props.name,
            arch=arch_of(props.major, props.minor),
            sm_count=get("multi_processor_count", base.sm_count),
            smem_per_block=get("shared_memory_per_block_optin", base.smem_per_block),
            smem_per_sm=get("shared_memory_per_multiprocessor", base.smem_per_sm),
            registers_per_sm=get("regs_per_multiprocessor", base.registers_per_sm),
            max_threads_per_block=get("max_threads_per_block", base.max_threads_per_block),
            max_threads_per_sm=get("max_threads_per_multi_processor", base.max_threads_per_sm),
            l2_bytes=get("L2_cache_size", base.l2_bytes),
            peak_bandwidth=base.peak_bandwidth if known else peak,
            copy_bandwidth=base.copy_bandwidth if known else peak * COPY_FRACTION,
        )

    @staticmethod
    def from_device(device=None) -> Target:
        """The target of a CUDA device (a torch.device, an index, or None: the
        current one), read from its properties once per device."""
        import torch

        if isinstance(device, torch.device):
            device = device.index
        if device is None:
            device = torch.cuda.current_device()
        return _from_index(device)


@functools.cache
def _from_index(index: int) -> Target:
    import torch

    return Target.from_props(torch.cuda.get_device_properties(index))


def arch_of(major: int, minor: int) -> str:
    """``sm_90a`` on compute capability 9.0 (wgmma/setmaxnreg need the a), else sm_XY."""
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def resolve(target) -> Target:
    """``fd.compile``'s ``target=``: a Target, or the name of a known one (``"H200"``)."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        for key, t in KNOWN.items():
            if target.lower() in (key.lower(), t.name.lower(), t.name.split()[0].lower()):
                return t
    raise CircbufError(
        f"target={target!r}: expected a circbuf.Target (circbuf.Target.from_device(), or "
        f"dataclasses.replace of one) or the name of a known one: {', '.join(t.name for t in KNOWN.values())}"
    )


# Hopper limits shared by the H100 SXM and the H200 (same GH100 chip, 132 SMs enabled)
_HOPPER = dict(
    arch="sm_90a",
    sm_count=132,
    smem_per_block=227 * 1024,
    smem_per_sm=228 * 1024,
    registers_per_sm=65536,
    registers_per_thread=255,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
)
# copy bandwidth measured with benchmarks' device-to-device copy (NOTES.md: H100 80GB HBM3
# 2958-3001 GB/s; H200 4139-4222 GB/s)
H100 = Target(name="H100 SXM", l2_bytes=50 * 2**20, peak_bandwidth=3.35e12, copy_bandwidth=3.0e12, **_HOPPER)
H200 = Target(name="H200", l2_bytes=60 * 2**20, peak_bandwidth=4.8e12, copy_bandwidth=4.2e12, **_HOPPER)
# what part of torch's device name identifies each (H100 PCIe and NVL differ from the SXM)
KNOWN = {"H100 80GB HBM3": H100, "H200": H200}
DEFAULT = H100  # compiling with no GPU

__all__ = ["Target", "H100", "H200", "KNOWN", "DEFAULT", "COPY_FRACTION", "arch_of", "resolve"]
