"""Memory per rank, predicted and measured.

* :mod:`guide.memory.predicted` -- **predicted** bytes per rank from parameter shapes (the ZeRO
  model: DDP, torch's ZeRO-1 (ZeroRedundancyOptimizer), the paper's ZeRO-2, FSDP2).
* :mod:`guide.memory.activations` -- **predicted** activation bytes, operation by operation
  (GPT- and Llama-style blocks, the logits and their gradient; Korthikanti's Eq. 1 for comparison).
* :mod:`guide.memory.transient` -- **predicted** bytes held only during the step: autocast's
  weight copies, FSDP2's gathered parameters and gradient buffers.
* :mod:`guide.memory.oom` -- out of memory with FSDP2: what to try, in order, each step priced
  with the modules above.
* :mod:`guide.memory.fit` -- all of it per GPU, per layout, against a GPU's memory, and the
  smallest world that fits (:func:`~guide.memory.fit.min_world_size`).
* :mod:`guide.memory.published` -- the model against published GPU peaks, with its tolerance.
* :mod:`guide.memory.measured` -- **measured** bytes a live rank holds between steps (tensor storage,
  DDP's reducer buckets).
* :mod:`guide.memory.budget` -- a rank's memory capped at its level plus a headroom (the data
  segment on CPU, the caching allocator's share of a GPU with CUDA).
* :mod:`guide.memory.peak` -- **measured** peak of a rank's process during a step.
* :mod:`guide.memory.state` -- :class:`~guide.memory.StateBytes`, the record both sides produce.
* :mod:`guide.memory.architectures` -- public model shapes (``PRESETS``).
* :mod:`guide.memory.cli` -- the ``guide-memory`` command (``python -m guide.memory``).
"""

from __future__ import annotations

from guide.memory.activations import activation_bytes
from guide.memory.architectures import PRESETS, Architecture
from guide.memory.measured import measure, param_shapes, reducer_bucket_bytes, storage_bytes
from guide.memory.peak import (
    MMAP_THRESHOLD,
    RESOLUTION_BYTES,
    PeakMemory,
    current_bytes,
    data_segment_bytes,
    is_prepared,
    prepare,
    release_freed_heap,
)
from guide.memory.predicted import (
    GPU_MEMORY_CONSTANTS,
    GPU_TOTAL_MEMORY_GIB,
    PRECISIONS,
    WORLD_SIZES,
    Precision,
    per_rank_state_bytes,
    state_bytes_by_rank,
    state_bytes_for_count,
    unsharded_param_bytes,
    zero1_partition,
)
from guide.memory.fit import min_world_size
from guide.memory.state import GB, StateBytes, GiB
from guide.memory.transient import (autocast_weight_bytes, fsdp2_buffer_bytes,
                                    fsdp2_split_root_buffer_bytes)

__all__ = [
    "GB", "GPU_MEMORY_CONSTANTS", "GPU_TOTAL_MEMORY_GIB", "GiB", "MMAP_THRESHOLD", "PRECISIONS",
    "PRESETS", "RESOLUTION_BYTES", "WORLD_SIZES",
    "Architecture", "PeakMemory", "Precision", "StateBytes", "activation_bytes",
    "autocast_weight_bytes", "current_bytes", "fsdp2_buffer_bytes", "fsdp2_split_root_buffer_bytes",
    "data_segment_bytes", "is_prepared", "measure", "min_world_size", "param_shapes",
    "per_rank_state_bytes", "prepare", "reducer_bucket_bytes", "release_freed_heap",
    "state_bytes_by_rank", "state_bytes_for_count", "storage_bytes", "unsharded_param_bytes", "zero1_partition",
]
