"""Cited constants: the only numbers on the site that no code of the site computes.

Hardware specifications, paper figures and published measurements enter the site here, each with
its source, and nowhere else: a page that needs one reads it from :data:`CONSTANTS` (and records
it in its ledger with :func:`cite`), so the "Every number on this site" page lists every constant
with its source in one table. A module may keep a named alias (``NVLINK = CONSTANTS[...].value``)
but not a second literal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

__all__ = ["CONSTANTS", "Constant", "LedgerLike", "cite", "value"]


class LedgerLike(Protocol):
    """What :func:`cite` needs of a ledger (:class:`guide.claims.Ledger`), named here so that the
    constants do not import the claims layer that sits above them."""

    def claim(self, name: str, value: Any, unit: str, *, guard: str = ...,
              **assumptions: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Constant:
    """A number from outside the site: its value, unit and where it comes from."""

    name: str
    value: float | int
    unit: str
    source: str


_ALL = (
    Constant("h100.memory_total", 81_559, "MiB",
             "nvidia-smi on an H100 80GB HBM3 (total, not usable: the CUDA context takes part)"),
    Constant("h200.memory_total", 143_771, "MiB",
             "nvidia-smi on an H200 141GB HBM3e (total, not usable)"),
    # -- communication: link rates, NCCL's latency model, published bus bandwidths (guide.comm.cost)
    Constant("h100.nvlink_bandwidth", 450e9, "bytes/s per GPU per direction",
             "NVIDIA H100 SXM datasheet: NVLink 900 GB/s per GPU, bidirectional"),
    Constant("h100.dense_bf16_flops", 989e12, "FLOP/s",
             "NVIDIA H100 SXM datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, half dense"),
    Constant("dgx_h100.gpus", 8, "GPUs per node",
             "NVIDIA DGX H100 datasheet: 8 x H100 Tensor Core GPUs, joined by NVLink switches"),
    Constant("dgx_h100.nics", 8, "NICs per node",
             "NVIDIA DGX H100 datasheet: 8 x single-port ConnectX-7, one per GPU"),
    Constant("ndr.nic_bandwidth", 50e9, "bytes/s per NIC per direction",
             "InfiniBand NDR / ConnectX-7: 400 Gb/s per port"),
    Constant("a100.nvlink_bandwidth", 300e9, "bytes/s per GPU per direction",
             "NVIDIA A100 SXM datasheet: NVLink 600 GB/s per GPU, bidirectional"),
    Constant("dgx_a100.gpus", 8, "GPUs per node",
             "NVIDIA DGX A100 datasheet: 8 x A100 Tensor Core GPUs, joined by NVSwitch"),
    Constant("dgx_a100.nics", 8, "NICs per node",
             "NVIDIA DGX A100 datasheet: 8 x single-port ConnectX-6 HDR for compute"),
    Constant("hdr.nic_bandwidth", 25e9, "bytes/s per NIC per direction",
             "InfiniBand HDR / ConnectX-6: 200 Gb/s per port"),
    *(Constant(f"nccl.tuning.{name}", v, "s",
               "NVIDIA/nccl src/graph/tuning.cc: baseLat and hwLat, ring algorithm, Simple protocol "
               f"(https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc); {what}")
      for name, v, what in (("base_latency", 8.4e-6, "per collective"),
                            ("nvlink_step_latency", 3.4e-6, "per ring step over NVLink"),
                            ("network_step_latency", 14e-6, "per ring step over the network"))),
    *(Constant(f"nccl_tests.{name}", v, "bytes/s (busbw)", f"{what} ({url})")
      for name, v, what, url in (
          ("h100_1node_ring.low", 365e9, "all_reduce_perf, 8 x H100 SXM, one node, NCCL_ALGO=RING, "
           "2-4 GB messages: 365-370 GB/s", "https://github.com/NVIDIA/nccl/issues/1455"),
          ("h100_1node_ring.high", 370e9, "the same, upper end",
           "https://github.com/NVIDIA/nccl/issues/1455"),
          ("ndr_per_nic.low", 46e9, "NVIDIA (AddyLaddy): two H100 nodes over NDR 400 Gb/s, ring: "
           "46-48 GB/s per NIC", "https://github.com/NVIDIA/nccl-tests/issues/290"),
          ("ndr_per_nic.high", 48e9, "the same, upper end",
           "https://github.com/NVIDIA/nccl-tests/issues/290"),
          ("dgx_h100_multinode", 380e9, "DGX H100, multi-node all_reduce, NVIDIA's figure quoted "
           "in the issue: about 380 GB/s", "https://github.com/NVIDIA/nccl-tests/issues/309"),
          ("dgx_a100_multinode", 192e9, "NVIDIA (AddyLaddy): DGX A100, 8 x 200 Gb/s IB, multi-node "
           "all_reduce: 192 GB/s", "https://github.com/NVIDIA/nccl/issues/812"))),
    # -- activation memory: Korthikanti et al.'s estimate (guide.memory.activations) ----------
    *(Constant(f"korthikanti.eq1.{name}", v, unit,
               "Korthikanti et al., Reducing Activation Recomputation in Large Transformer "
               "Models, arXiv 2205.05198, §4.1 Eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer "
               "(16-bit activations, dropout masks, a 4h MLP)")
      for name, v, unit in (("sbh_bytes", 34, "bytes per token, hidden unit and layer"),
                            ("scores_bytes", 5, "bytes per head, token² and layer"))),
    # -- ZeRO, Figure 1 (docs/pages/memory_calculator.md reproduces it) ----------------------
    *(Constant(f"zero.figure1.{name}", v, unit,
               "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion "
               f"Parameter Models, arXiv 1910.02054, Figure 1: {what}")
      for name, v, unit, what in (
          ("params", 7_500_000_000, "parameters", "the model size Ψ"),
          ("world_size", 64, "devices", "the data-parallel degree N_d"),
          ("k", 12, "bytes per parameter", "K, mixed-precision Adam's optimizer state (§3.1)"),
          ("baseline", 120.0, "GB", "baseline DP, model state per device"),
          ("p_os", 31.4, "GB", "P_os (stage 1), model state per device"),
          ("p_os_g", 16.6, "GB", "P_os+g (stage 2), model state per device"),
          ("p_os_g_p", 1.9, "GB", "P_os+g+p (stage 3), model state per device"))),
    # -- the seed notebook's memory claims, quoted (the calculator's errata) -----------------
    *(Constant(f"seed.{name}", v, unit, f"the seed notebook this site grew out of: {what}")
      for name, v, unit, what in (
          ("params", 70_000_000_000, "parameters", "the model size of its memory section"),
          ("code_bytes_per_param", 8, "bytes per parameter", "what its per_rank_mem counts"),
          ("ddp_per_gpu", 1.1, "TiB", "its prose, DDP per GPU"),
          ("fsdp2_per_gpu", 140, "GiB", "its prose, FSDP2 per GPU (\"~140 GiB\")"),
          ("fsdp2_world_size", 8, "GPUs", "its prose, the N of that FSDP2 figure"))),
    # -- memory estimators people use (plot_activation_memory compares them) -----------------
    Constant("deepspeed.zero3_estimate.bytes_per_param", 18, "bytes per parameter, over N",
             "DeepSpeed estimate_zero3_model_states_mem_needs, no offload "
             "(https://deepspeed.readthedocs.io/en/latest/memory.html): "
             "18 * params / N + 4 * largest_layer_params"),
    Constant("deepspeed.zero3_estimate.largest_layer_bytes", 4,
             "bytes per parameter of the largest layer",
             "DeepSpeed estimate_zero3_model_states_mem_needs, no offload "
             "(https://deepspeed.readthedocs.io/en/latest/memory.html)"),
    Constant("accelerate.estimate_memory.adam_factor", 4, "x the model's size in its load dtype",
             "Hugging Face Accelerate, accelerate estimate-memory, 'Training using Adam' "
             "(https://huggingface.co/docs/accelerate/usage_guides/model_size_estimator)"),
    # -- published per-GPU memory of real runs (plot_activation_memory) ----------------------
    *(Constant(f"torchtitan.llama3-8b.{name}", v, unit,
               "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md "
               "(https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
               "llama3_h100_202412_torchtitan.md): Llama-3.1-8B, FSDP, H100 96GB, selective (op) "
               f"activation checkpointing, eager; {what}")
      for name, v, unit, what in (
          ("seq_len", 8192, "tokens", "the sequence length of that time's llama3_8b.toml"),
          ("local_batch", 2, "sequences per GPU", "local batch size"),
          ("table1.world_size", 8, "GPUs", "Table 1"),
          ("table1.memory", 82.4, "GiB", "Table 1, Memory (peak reserved, max_reserved_gib)"),
          ("table3.world_size", 128, "GPUs", "Table 3"),
          ("table3.memory", 67.0, "GiB", "Table 3, Memory (peak reserved, max_reserved_gib)"))),
    *(Constant(f"torchtitan.llama3-8b.mfu.{name}", v, "fraction of the dense bf16 peak",
               "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md "
               "(https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
               "llama3_h100_202412_torchtitan.md): 'the 1D Llama 3.1 8B model training on 8 or "
               "128 H100 GPUs without Float8 achieves 33% to 39% MFU' (FSDP, bf16, against the "
               f"H100 SXM peak; footnote 2: its GPUs' real peak is lower); {what}")
      for name, v, what in (("low", 0.33, "the low end"), ("high", 0.39, "the high end"))),
    *(Constant(f"lightning.fsdp_guide.{name}", v, unit,
               "Lightning Fabric's FSDP guide "
               "(https://lightning.ai/docs/fabric/2.1.0/advanced/model_parallel/fsdp.html): "
               f"A100 40GB, PyTorch 2.1, the 1B demo transformer, fp32, Adam; {what}")
      for name, v, unit, what in (
          ("world_size", 2, "GPUs", "GPUs"),
          ("seq_len", 35, "tokens", "one sequence per GPU"),
          ("ddp.memory", 26_953, "MiB",
           "DDP, 'MB' read as the MiB torch.cuda.memory_summary prints"),
          ("full_shard.memory", 11_578, "MiB",
           "FULL_SHARD, 'MB' read as the MiB torch.cuda.memory_summary prints"))),
)

#: Every cited constant, by name.
CONSTANTS: dict[str, Constant] = {c.name: c for c in _ALL}


def value(name: str) -> float | int:
    """The value of the cited constant ``name`` (a clear error for an unknown name)."""
    try:
        return CONSTANTS[name].value
    except KeyError:
        raise KeyError(f"no cited constant {name!r}; known: {sorted(CONSTANTS)}. Add it to "
                       "guide.constants with its source.") from None


def cite(ledger: LedgerLike, name: str) -> float | int:
    """Record in ``ledger`` that its page states the constant ``name``; return its value."""
    c = CONSTANTS.get(name)
    if c is None:
        value(name)  # raises the clear error
    return ledger.claim(f"constant.{c.name}", c.value, c.unit, guard=f"cited: {c.source}")
