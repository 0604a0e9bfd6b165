"""Moving small host data (index lists, per-request parameters) to the device without making the
host wait: upstream vLLM's `async_tensor_h2d`."""

import torch

__all__ = ["async_tensor_h2d"]


def async_tensor_h2d(
    data: list | torch.Tensor, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`data` as a `dtype` tensor on `device`. To a GPU the copy goes from pinned memory without
    blocking: from pageable memory it would synchronize the stream, so the host would wait for
    every kernel queued before it (torch's caching host allocator keeps the pinned block until
    the copy has run)."""
    cpu = torch.as_tensor(data, dtype=dtype)
    if device.type == "cpu":
        return cpu
    return cpu.pin_memory().to(device, non_blocking=True)
