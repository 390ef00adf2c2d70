"""cuobjdump on a cubin (PyPI nvidia-cuda-cuobjdump + nvidia-cuda-nvdisasm):
SASS text and resource usage, on a machine with no GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile


def find_tool(name: str) -> str | None:
    """The tool on PATH, or in the nvidia/cu*/bin folder of installed wheels."""
    p = shutil.which(name)
    if p:
        return p
    for base in sys.path:
        for sub in ("cu13", "cu12", "cuda_cuobjdump", "cuda_nvdisasm"):
            cand = os.path.join(base, "nvidia", sub, "bin", name)
            if os.path.exists(cand):
                return cand
    return None


def cuobjdump(cubin: bytes, *args: str) -> str:
    tool = find_tool("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    env = dict(os.environ)
    nvd = find_tool("nvdisasm")
    if nvd:
        env["PATH"] = os.path.dirname(nvd) + os.pathsep + env.get("PATH", "")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        r = subprocess.run([tool, *args, path], capture_output=True, text=True, env=env, check=False)
        if r.returncode:
            raise RuntimeError(f"cuobjdump failed: {r.stderr}")
        return r.stdout
    finally:
        os.unlink(path)


def resource_usage(cubin: bytes) -> dict:
    text = cuobjdump(cubin, "-res-usage")
    out = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", text)
        if m:
            out[key] = int(m.group(1))
    return out
