"""The memory model against published GPU measurements: what it predicts for each run whose
configuration is completely published, and how far from the measured peak it may be.

``published.json`` (beside this module) holds the runs, each with its source (URL, table and row,
the commit the run used): torchtitan's December 2024 H100 benchmark, Llama-3.1-8B under FSDP2 on
8 and 128 GPUs, two micro-batch sequences of 8,192 tokens, op-level selective checkpointing,
eager and compiled. Their figure is torchtitan's ``memory:`` log field, the caching allocator's
**peak reserved** bytes. Runs whose configuration is incomplete (float8 options, pipeline
schedules, an unstated peak statistic) are left out, not guessed.

:func:`predict` is :func:`guide.memory.fit.per_gpu`'s total for the run, the number the site's
pages and calculator give. What it counts is allocated tensors at the start of backward; the
published peak also holds what the model leaves out, each of which only adds:

* the caching allocator's reserve over what is allocated (rounding, fragmentation; the
  multi-node runs did not set ``expandable_segments``);
* the loss backward's third vocabulary-sized fp32 tensor (``log_softmax``'s backward holds the
  saved log-probabilities, their incoming gradient and its output at once: ``4 * vocab`` bytes
  per token more than :func:`guide.memory.activations.logits_bytes`, 7.8 GiB for these runs);
* the optimizer step's ``foreach`` temporaries, NCCL's and the CUDA context's memory (outside
  PyTorch's reserved count, but taken from the same GPU).

Hence :data:`TOLERANCE`: a prediction must not exceed the published peak (it would count
something that is not there), and may fall short of it by at most 20 % (the logits' third copy is
9.5 % of the 8-GPU peak; allocator reserve over allocated is of the order of 10 % without
expandable segments). ``torch.compile`` saves less than eager, which the model does not model:
the compiled runs sit nearer to it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from guide.memory.activations import activation_bytes
from guide.memory.architectures import PRESETS
from guide.memory.fit import per_gpu
from guide.memory.predicted import PRECISIONS
from guide.memory.state import GiB

__all__ = ["PUBLISHED", "TOLERANCE", "PublishedPeak", "DriftedPrediction", "check", "error",
           "predict"]

#: The allowed relative error of a prediction against a published peak: (most under, most over).
TOLERANCE = (-0.20, 0.0)


@dataclasses.dataclass(frozen=True)
class PublishedPeak:
    """One published run: its configuration in the model's vocabulary, and its measured peak."""

    id: int
    source: dict
    model: dict
    strategy: str
    gpus: int
    hardware: str
    precision: str
    optimizer: str
    precision_as_published: str
    micro_batch: int
    seq_len: int
    checkpointing: str
    checkpointing_as_published: str
    compile: bool
    float8: bool
    metric: str
    metric_as_published: str
    value_gib: float
    notes: str

    @property
    def label(self) -> str:
        return (f"{self.model['name']}, {self.gpus} GPUs"
                + (", torch.compile" if self.compile else ", eager"))


#: The published runs, in the order of ``published.json``.
PUBLISHED = tuple(PublishedPeak(**row) for row in json.loads(
    (Path(__file__).with_name("published.json")).read_text()))


class DriftedPrediction(ValueError):
    """A prediction left :data:`TOLERANCE` of its published peak."""


def predict(run: PublishedPeak) -> int:
    """The model's bytes per GPU for ``run``: what the calculator gives for its configuration."""
    arch = PRESETS[run.model["preset"]]
    if arch.n_params != run.model["params"]:
        raise ValueError(f"run {run.id}: preset {run.model['preset']} has {arch.n_params:,} "
                         f"parameters, the source {run.model['params']:,}.")
    act = activation_bytes(arch, run.seq_len, run.micro_batch, checkpointing=run.checkpointing,
                           bytes_per_element=PRECISIONS[run.precision].compute)
    return per_gpu(arch, run.strategy, run.gpus, run.precision, run.optimizer, activations=act,
                   ddp_buckets=True).total


def error(run: PublishedPeak) -> float:
    """The prediction's relative error against the published peak (negative: below it)."""
    return predict(run) / (run.value_gib * GiB) - 1


def check(run: PublishedPeak) -> float:
    """:func:`error`, or :class:`DriftedPrediction` naming the run when it leaves
    :data:`TOLERANCE`."""
    err = error(run)
    low, high = TOLERANCE
    if not low <= err <= high:
        raise DriftedPrediction(
            f"run {run.id} ({run.label}, {run.source['locator']}): predicted "
            f"{predict(run) / GiB:.1f} GiB against the published {run.value_gib} GiB, "
            f"{err:+.1%}, outside {low:+.0%}..{high:+.0%}: a changed formula moved it; see "
            "guide.memory.published for what the model leaves out.")
    return err
