"""The hangs-and-order page (``examples/plot_when_fsdp2_breaks.py``) and :mod:`guide.hangs`.

A page that hangs on purpose must end either way. The tests inject a hang where none belongs (a
rank stuck in Python in the page's hang demonstration; the page's fixed run reverted to the
mistake) and require the page to fail by name, within its timeouts, instead of waiting; and
they hold the page to torch's messages, verbatim, so a search for the error lands there.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES, run_python
from faults import write_faulty

import guide
from guide import hangs
from guide.checks import CheckFailed

PAGE = EXAMPLES / "plot_when_fsdp2_breaks.py"

#: What torch prints (torch 2.13's words, with its gloo), as the page must show it.
SYMPTOMS = [
    ("RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor, need to convert "
     "all torch.Tensor to DTensor before calling distributed operators!"
     if torch.__version__ >= "2.13" else "got mixed torch.Tensor and DTensor"),
    "Timed out waiting 3000ms for",
    "Received data size doesn't match expected size. Is there a distributed collective mismatch "
    "in your code?",
]

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the fixed run reverted to the early return, and (as tests/faults.py's rank_hangs) a 10 s
    # process-group timeout instead of the default 30 s, to keep the test short
    "fix_skips_the_expert": [
        ("fix", 'out = {"zero tokens": moe_steps(shard_moe(moe(), mesh, True), rank, skip=True)}'),
        ("fixes-launch",
         "FIXES = guide.launch(moe_fixes, WORLD_SIZE, collective_timeout_s=10)[0]")],
    # in the hang demonstration, rank 1 stuck in Python before its first step, forever
    "demo_rank_stuck": [
        ("hang-steps", "if rank.rank == 1:\n"
                       "    import time; time.sleep(3600)\n"
                       "{statement}")],
}
#: fault -> (what the output must say, seconds the whole page may take on 2 busy cores)
EXPECTED = {
    # the rank whose 10 s timeout fired, named as the failure or beside its peer's closed
    # connection (which of the two the launcher reports first differs between torch releases:
    # 2.13 names the timeout, 2.14 the peer that saw it close)
    "fix_skips_the_expert": (r"(?s)RankRaised: rank \d of 2 raised RuntimeError: .*"
                             r"rank \d: raised RuntimeError: .*Timed out waiting 10000ms", 240),
    "demo_rank_stuck": (r"\[pitfall reproduces\] 3\. skipped module \(own group\): the ranks "
                        r"waited in \{0: 'all-gather', 1: ''\}", 240),
}


# -- the page ------------------------------------------------------------------------------------

@pytest.mark.parametrize("symptom", SYMPTOMS, ids=lambda s: s.split(" ")[0])
def test_page_prints_torchs_words(page: dict, symptom: str) -> None:
    assert symptom in page["OUTPUT"]


def test_every_hang_was_bounded_by_the_timeout(page: dict) -> None:
    """Both failing jobs ended in seconds, not torch's 30 minutes: the own-group hang by gloo's
    timeout (on the rank that waited longest), the shared-group one by gloo's abort at once."""
    result = page["RESULT"]
    own, shared = result["HANGS"][True], result["HANGS"][False]
    timeout = result["HANG_TIMEOUT_S"]
    assert own.seconds < timeout + 15 and shared.seconds < 15
    assert all(s.seconds is None or s.seconds < timeout + 5 for s in own.ranks)
    assert type(shared.error) is guide.RankDied and "SIGABRT" in str(shared.error)


def test_the_wrong_orders_freeze_the_root_and_only_the_root(page: dict) -> None:
    order = page["RESULT"]["ORDER"][0]
    root = set(page["RESULT"]["ROOT_PARAMS"])
    assert set(order["optimizer between"]["frozen"]) == root
    assert set(order["forward first"]["frozen"]) == root
    assert order["fully_shard, then optimizer"]["frozen"] == []
    assert order["forward, reshard()"]["frozen"] == []


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_hang_fails_the_page_by_name_within_its_timeout(fault: str,
                                                                    tmp_path: Path) -> None:
    pattern, budget = EXPECTED[fault]
    run = run_python(write_faulty(PAGE, FAULTS[fault], tmp_path), timeout=budget + 60)
    assert run.returncode != 0, f"{fault}: the page passed with the fault\n{run.output[-3000:]}"
    assert re.search(pattern, run.output), f"{fault}: not found:\n{run.output[-3000:]}"
    assert run.seconds < budget, f"{fault}: took {run.seconds:.0f} s (budget {budget} s)"


# -- guide.hangs ---------------------------------------------------------------------------------

def test_gist_drops_locations_and_addresses() -> None:
    said = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
            "closed by peer [127.0.0.1]:51426.\nThis is typically caused by a crash.")
    assert hangs.gist(said) == "Connection closed by peer. This is typically caused by a crash."
    assert hangs.gist("Timed out waiting 3000ms") == "Timed out waiting 3000ms"


def test_waiting_in_prefers_fsdp2_names() -> None:
    stack = ('File "_fsdp_collectives.py", line 184 in foreach_reduce\n'
             'File "distributed_c10d.py", line 4943 in reduce_scatter_single\n')
    assert hangs.waiting_in(stack) == "reduce-scatter"
    assert hangs.waiting_in("in foreach_all_gather\nin all_reduce") == "all-gather"
    assert hangs.waiting_in("in all_reduce") == "all-reduce"
    assert hangs.waiting_in("in train_step") == ""


def _finishes(rank: guide.Rank, folder: str) -> None:
    with hangs.witness(folder, rank.rank):
        dist.barrier()


def test_a_job_that_no_longer_fails_fails_the_page() -> None:
    with pytest.raises(CheckFailed, match=r"\[pitfall reproduces\] demo: the job finished"):
        hangs.expect_failure("demo", _finishes, 2, timeout_s=5)


def _stuck_on_rank1(rank: guide.Rank, folder: str) -> None:
    with hangs.witness(folder, rank.rank):
        if rank.rank == 1:
            time.sleep(3600)  # stuck in Python, outside any collective
        dist.all_reduce(torch.ones(1))


def test_a_stuck_rank_is_a_bounded_failure_with_each_ranks_story() -> None:
    """Rank 1 never comes: rank 0 waits in the all-reduce for timeout_s, then the launcher names
    rank 1; the stories say where rank 0 waited and how long, and that rank 1 said nothing."""
    start = time.monotonic()
    failed = hangs.expect_failure("demo", _stuck_on_rank1, 2, timeout_s=2, deadline_s=60)
    assert time.monotonic() - start < 60  # startup included: the wait itself is bounded below
    assert type(failed.error) is guide.RankHung and failed.error.rank == 1
    zero, one = failed.ranks
    assert zero.waiting_in == "all-reduce" and "Timed out waiting 2000ms" in zero.error
    assert 2 <= zero.seconds < 6
    assert (one.error, one.seconds) == ("", None)
    assert any("RankHung: rank 1 of 2 hung" in m for m in failed.messages)
