import os

import pytest

os.environ.setdefault("CIRCBUF_POISON_OUTPUTS", "1")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    # CIRCBUF_SHARD=i/n keeps every n-th test from the i-th: scripts/gpu_check.sh
    # runs n shards side by side (compiling kernels is CPU-bound; the GPU is not busy)
    shard = os.environ.get("CIRCBUF_SHARD")
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        keep = [it for k, it in enumerate(items) if k % n == i]
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
