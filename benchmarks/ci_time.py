"""Per-session times of a CI run, from its log: which session is the long pole, and what overlaps.

``.ci/run`` runs nox with ``--add-timestamp``, so every nox line carries its wall-clock time. This
script pairs each ``Running session X`` with its ``Session X was successful`` (or ``failed``) line
and prints one row per session: when it started (minutes after the first session began), how long
it took, and how it ended, then the whole span. The compat lane runs beside the others, so its rows
overlap theirs; the span is what CI waited. pytest's ``slowest durations`` block, when the log has
one (``--durations=N``), is printed after the table, longest first.

    python benchmarks/ci_time.py ci.log          # or: ... | python benchmarks/ci_time.py -
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from datetime import datetime

_STAMP = r"nox > \[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] "
_START = re.compile(_STAMP + r"Running session (?P<name>\S+)\s*$")
_END = re.compile(_STAMP + r"Session (?P<name>\S+) (?P<how>was successful|failed|was skipped)\b")
_DURATION = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)s (?P<phase>call|setup|teardown)\s+(?P<test>\S+)")


@dataclasses.dataclass(frozen=True)
class Session:
    """One nox session of the run: its name, when it started and ended, and how it ended."""

    name: str
    start: datetime
    end: datetime | None
    outcome: str  # "passed", "failed", "skipped" or "unfinished" (no end line: the run stopped)

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else (self.end - self.start).total_seconds()


def _when(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")


def sessions(lines: list[str]) -> list[Session]:
    """The sessions of a log in the order they started. A session started twice (a rerun) counts
    twice; an end line without a start is an error (the log is not one run's)."""
    open_: dict[str, list[datetime]] = {}
    found: list[tuple[str, datetime, datetime | None, str]] = []
    for line in lines:
        if m := _START.search(line):
            open_.setdefault(m["name"], []).append(_when(m["at"]))
            found.append((m["name"], _when(m["at"]), None, "unfinished"))
        elif m := _END.search(line):
            starts = open_.get(m["name"])
            if not starts:
                raise ValueError(f"session {m['name']} ends without having started: "
                                 "give the whole log of one run")
            start = starts.pop(0)
            how = {"was successful": "passed", "failed": "failed", "was skipped": "skipped"}[m["how"]]
            k = found.index((m["name"], start, None, "unfinished"))
            found[k] = (m["name"], start, _when(m["at"]), how)
    return [Session(*row) for row in sorted(found, key=lambda row: row[1])]


def slowest(lines: list[str]) -> list[tuple[float, str, str]]:
    """pytest's ``--durations`` rows: (seconds, phase, test), longest first."""
    rows = [(float(m["s"]), m["phase"], m["test"]) for line in lines if (m := _DURATION.match(line))]
    return sorted(rows, reverse=True)


def report(lines: list[str]) -> str:
    """The table of sessions, the span, and the slowest tests, as text."""
    found = sessions(lines)
    if not found:
        raise ValueError("no timestamped nox session in the log: run nox with --add-timestamp "
                         "(.ci/run does)")
    first = found[0].start
    out = [f"{'session':40} {'start':>9} {'took':>9}  outcome"]
    for s in found:
        took = "-" if s.seconds is None else f"{s.seconds / 60:.1f} min"
        out.append(f"{s.name:40} {(s.start - first).total_seconds() / 60:>5.1f} min "
                   f"{took:>9}  {s.outcome}")
    ends = [s.end for s in found if s.end is not None]
    if ends:
        out.append(f"span: {(max(ends) - first).total_seconds() / 60:.1f} min from the first "
                   f"session's start to the last one's end")
    if rows := slowest(lines):
        out.append("\nslowest tests:")
        out += [f"{s:8.2f} s  {phase:8} {test}" for s, phase, test in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a CI log (the output of bash .ci/run), or - for stdin")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.log == "-" else open(args.log, encoding="utf-8").read()
    try:
        print(report(text.splitlines()))
    except ValueError as err:
        print(f"ci_time: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
