"""guide.compiled: Dynamo's counts read back, with the faults the compile page's checks must catch.

Single process, backend ``"eager"`` (Dynamo's capture and guards without AOTAutograd): the
recompile and graph-break bookkeeping is Dynamo's, whatever the backend.
"""

from __future__ import annotations

import torch
from torch import nn

from guide import compiled


class Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _run_blocks(scales: list[float], input_grad: bool = True) -> compiled.CompileReport:
    compiled.reset()
    blocks = [Scaled(s) for s in scales]
    for block in blocks:
        block.compile(backend="eager", fullgraph=True)
    x = torch.randn(2, 4, requires_grad=input_grad)  # in a model: an activation, grad required
    for block in blocks:
        x = block(x)
    return compiled.report()


def test_identical_blocks_share_one_graph() -> None:
    rep = _run_blocks([0.5, 0.5, 0.5])
    assert (rep.graphs, rep.recompiles, rep.graph_breaks) == (1, 0, 0)
    assert rep.ops_captured > 0 and rep.compile_seconds > 0


def test_a_per_block_constant_is_a_recompile_with_torchs_reason() -> None:
    """The fault the page's 'one graph, no recompile' check exists for: blocks that differ in a
    Python constant their forward reads are guarded apart."""
    rep = _run_blocks([0.5, 0.25])
    assert rep.recompiles == 1 and rep.graphs == 2
    assert "scale" in rep.recompile_reasons[0]


def test_a_first_block_fed_data_recompiles_once() -> None:
    """Block 0 fed a tensor that needs no grad, the next ones activations: Dynamo guards on
    requires_grad, so identical blocks still compile twice (TinyLM's block 0 gets the embeddings'
    output, which needs grad, so the page sees none)."""
    rep = _run_blocks([0.5, 0.5, 0.5], input_grad=False)
    assert rep.recompiles == 1 and "requires_grad" in rep.recompile_reasons[0]


def test_a_graph_break_is_counted_with_its_reason() -> None:
    compiled.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(3))
    rep = compiled.report()
    assert rep.graph_breaks == 1 and rep.graphs == 2
    assert rep.break_reasons and all(r for r in rep.break_reasons)


def test_reset_forgets_everything() -> None:
    _run_blocks([0.5, 0.25])
    compiled.reset()
    assert compiled.report() == compiled.CompileReport(0, 0, 0, 0, (), 0, (), 0.0)


def test_short_reason_keeps_the_first_line_of_each_chained_break() -> None:
    text = ("Attempted to call function marked as skipped\n  Explanation: ...\n\n"
            "*** While handling this graph break, another graph break occurred: ***\n\n"
            "graph break in loop\n  Explanation: ...")
    assert compiled.short_reason(text) == ("Attempted to call function marked as skipped -> "
                                           "graph break in loop")


def test_a_lazy_backward_compilation_is_not_a_frame() -> None:
    """With AOTAutograd (``aot_eager``, as inductor does) the first backward compiles the backward
    graph lazily and Dynamo logs it as a second compilation (``is_forward=False``): one frame was
    compiled, not two, and its compile time is the forward entry's."""
    from torch._dynamo.utils import get_compilation_metrics

    compiled.reset()
    block = Scaled(0.5)
    block.compile(backend="aot_eager", fullgraph=True)
    block(torch.randn(2, 4, requires_grad=True)).sum().backward()
    metrics = get_compilation_metrics()
    assert [m.is_forward for m in metrics] == [True, False]  # what the guard is for
    rep = compiled.report()
    assert (rep.frames, rep.graphs, rep.recompiles, rep.graph_breaks) == (1, 1, 0, 0)
    assert rep.compile_seconds == metrics[0].entire_frame_compile_time_s > 0


def test_frames_count_each_compiled_frame_and_break_reasons_name_each_break() -> None:
    """A graph break splits one function into two compiled frames; a frame Dynamo gives up on
    (``unimplemented``) is counted with the resumed breaks."""
    compiled.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(3))
    rep = compiled.report()
    assert rep.frames == 2 and rep.ops_captured == 2
    assert len(rep.break_reasons) == 1 and "graph_break" in rep.break_reasons[0]
    from torch._dynamo.utils import counters

    counters["unimplemented"]["a reason Dynamo gave up on\n  Explanation: ..."] += 2
    rep = compiled.report()
    assert rep.graph_breaks == 3
    assert rep.break_reasons[-1] == "a reason Dynamo gave up on"


def test_short_reason_drops_a_chained_break_with_no_text() -> None:
    chained = "*** While handling this graph break, another graph break occurred: ***"
    assert compiled.short_reason(f"first\n  more\n{chained}\n  \n") == "first"
    assert compiled.short_reason("") == ""
