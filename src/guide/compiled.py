"""What ``torch.compile`` did in this process, read from Dynamo's own instruments.

:func:`reset` clears Dynamo's caches and counters before a run; :func:`report` reads them after it
into a :class:`CompileReport`: the frames Dynamo compiled, the graphs it captured
(``torch._dynamo.utils.counters["stats"]["unique_graphs"]``), the recompiles and torch's reason for
each (``recompile_reason`` of ``torch._dynamo.utils.get_compilation_metrics()``), the graph breaks
and torch's reason for each (``counters["graph_break"]``, breaks Dynamo resumed after, and
``counters["unimplemented"]``, breaks that made it give up on a frame and run it eagerly), and the
seconds it spent compiling. Nothing here is a model of what should happen: pages compare these
numbers with what they expect (``0`` recompiles across identical blocks, one graph for all of them).
"""

from __future__ import annotations

import dataclasses

__all__ = ["CompileReport", "report", "reset", "short_reason"]


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """Dynamo's counts for this process since the last :func:`reset`."""

    frames: int  #: frames compiled (forward entries of Dynamo's compilation metrics)
    graphs: int  #: distinct graphs captured
    ops_captured: int  #: calls (ops) captured into those graphs
    recompiles: int  #: compilations of a frame already compiled, whose guards failed
    recompile_reasons: tuple[str, ...]
    graph_breaks: int  #: breaks resumed after, plus frames given up (run eagerly)
    break_reasons: tuple[str, ...]  #: torch's reason for each, first lines (:func:`short_reason`)
    compile_seconds: float  #: Dynamo's whole-frame compile time, summed over frames


def reset() -> None:
    """Forget every compiled frame, counter and compilation metric of this process."""
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()


def short_reason(reason: str) -> str:
    """Torch's graph-break text cut to what a reader needs: the first line of each break it
    chains (``"*** While handling this graph break, another graph break occurred ***"``)."""
    parts = reason.split("*** While handling this graph break, another graph break occurred: ***")
    heads = [next((ln.strip() for ln in p.splitlines() if ln.strip()), "") for p in parts]
    return " -> ".join(h for h in heads if h)


def report() -> CompileReport:
    """Read Dynamo's counters and compilation metrics (see the module docstring)."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    metrics = get_compilation_metrics()
    recompiles = tuple(m.recompile_reason for m in metrics if m.recompile_reason)
    breaks = {**counters["graph_break"], **counters["unimplemented"]}
    return CompileReport(
        frames=sum(m.is_forward is not False for m in metrics),  # False: a lazy backward
        graphs=int(counters["stats"]["unique_graphs"]),
        ops_captured=int(counters["stats"]["calls_captured"]),
        recompiles=len(recompiles),
        recompile_reasons=recompiles,
        graph_breaks=int(sum(breaks.values())),
        break_reasons=tuple(short_reason(r) for r in breaks),
        compile_seconds=float(sum(m.entire_frame_compile_time_s or 0.0 for m in metrics)),
    )
