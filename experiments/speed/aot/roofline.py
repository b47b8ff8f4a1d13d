"""Roofline step times of the decode programs on published GPU peaks, from the analytic counts of `costs.py`.

What it follows:
  * The roofline model (Williams, Waterman and Patterson, CACM 2009): a program takes at least
    max(FLOPs / peak FLOP/s, bytes / memory bandwidth). It is a lower bound on time, with no kernel efficiency,
    launch overhead or communication in it.

The published peaks are data with their sources (`HARDWARE`): dense (no 2:4 sparsity) tensor-core FLOP/s in bf16
and FP8 and HBM bandwidth. FP8 weights halve the weight bytes (every weight, the embedding table too) and run the
matmuls at the FP8 peak; the KV cache stays bf16 and the logits float32.
"""

from __future__ import annotations

import dataclasses

from aot.costs import Counts

# ---------------------------------------------------------------------------------------------------------------------
# Published hardware peaks.


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One GPU's published peaks: dense tensor-core TFLOP/s in bf16 and FP8, HBM bandwidth, and where they come from."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_tb_per_s: float
    memory_gb: float
    source: str

    def flops_per_s(self, weights: str) -> float:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights {weights!r} is not one of {sorted(WEIGHT_FORMATS)}.")
        return 1e12 * (self.fp8_tflops if weights == "fp8" else self.bf16_tflops)

    @property
    def bytes_per_s(self) -> float:
        return 1e12 * self.hbm_tb_per_s


HARDWARE: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        Hardware(
            name="H100 SXM",
            bf16_tflops=989.4,
            fp8_tflops=1978.9,
            hbm_tb_per_s=3.35,
            memory_gb=80,
            source="NVIDIA H100 Tensor Core GPU datasheet and product page (nvidia.com/en-us/data-center/h100/), "
            "SXM column: BF16 1,979 and FP8 3,958 TFLOPS 'with sparsity', halved for dense (989.4 and 1,978.9 in "
            "the NVIDIA H100 Tensor Core GPU Architecture whitepaper); 80 GB HBM3 at 3.35 TB/s.",
        ),
        Hardware(
            name="H200 SXM",
            bf16_tflops=989.4,
            fp8_tflops=1978.9,
            hbm_tb_per_s=4.8,
            memory_gb=141,
            source="NVIDIA H200 Tensor Core GPU datasheet and product page (nvidia.com/en-us/data-center/h200/), "
            "SXM column: BF16 1,979 and FP8 3,958 TFLOPS with sparsity, halved for dense (the H100's compute); "
            "141 GB HBM3e at 4.8 TB/s.",
        ),
        Hardware(
            name="B200 (HGX)",
            bf16_tflops=2250.0,
            fp8_tflops=4500.0,
            hbm_tb_per_s=7.7,
            memory_gb=180,
            source="NVIDIA HGX platform specifications (nvidia.com/en-us/data-center/hgx/), per-GPU HGX B200 "
            "column: FP16/BF16 4.5 and FP8 9 PFLOPS with sparsity, halved for dense; 180 GB HBM3e at 7.7 TB/s "
            "(the DGX B200 datasheet gives 64 TB/s for 8 GPUs, 8 TB/s each).",
        ),
    )
}
"""Name -> published peaks (dense tensor-core figures: NVIDIA quotes 2:4-sparse figures, twice the dense ones)."""

WEIGHT_FORMATS: dict[str, int] = {"bf16": 2, "fp8": 1}
"""Weight format -> bytes per weight."""


# ---------------------------------------------------------------------------------------------------------------------
# Roofline.


@dataclasses.dataclass(frozen=True)
class Roofline:
    """max(compute time, memory time): a lower bound on the step time."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def roofline(counts: Counts, hardware: Hardware, weights: str) -> Roofline:
    """The roofline time of `counts` on `hardware` with `weights` ("bf16" or "fp8": the FLOP peak used)."""
    return Roofline(
        compute_s=counts.flops / hardware.flops_per_s(weights), memory_s=counts.bytes / hardware.bytes_per_s
    )


def canvas_tokens_per_s(batch: int, canvas: int, steps: int, step_s: float) -> float:
    """Block-diffusion throughput from the step time: batch x canvas / ((steps + 1) x step), the +1 the commit."""
    return batch * canvas / ((steps + 1) * step_s)
