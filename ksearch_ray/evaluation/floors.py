"""Physical floors: no honest call is faster than its work at the GPU's peak compute and bandwidth.

A task declares per-workload lower bounds on FLOPs and bytes (task.json `cost`); with a GPU's
peaks that gives a time no real measurement can undercut. The peaks are deliberately generous
(above any datasheet figure, sparse FP8 included, and twice the HBM bandwidth), so the floor only
catches measurements that are wrong by a wide margin, never a fast honest kernel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeaks:
    """A device's ceilings, generous on purpose."""

    name: str
    flops_per_s: float
    bytes_per_s: float

    def floor_ms(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s) * 1e3


# Datasheets: H100 SXM 1979 dense / 3958 sparse FP8 TFLOP/s, HBM3 3.35 TB/s (NVL 3.9 TB/s);
# H200 the same compute, HBM3e 4.8 TB/s. Ceilings here: 4 PFLOP/s and twice the fastest HBM of
# the family (room for L2 hits an incomplete flush would allow).
_KNOWN = (
    ("H200", DevicePeaks("H200", 4.0e15, 9.6e12)),
    ("H100", DevicePeaks("H100", 4.0e15, 7.8e12)),
)


def peaks_for(device_name: str) -> DevicePeaks | None:
    """Peaks of a GPU by its CUDA name (e.g. 'NVIDIA H200'); None for devices not listed (the CPU)."""
    for key, peaks in _KNOWN:
        if key in device_name:
            return peaks
    return None
