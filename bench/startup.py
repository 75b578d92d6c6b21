"""Start-up time of the command line: what `circuitstat --help`, `check --help`, `query --help` and
`report --help` cost, against the interpreter's own start-up and against importing torch.

The commands that only read runs (check, query, report) and every --help must not import torch or
scipy; this prints each command's wall time (median of repeats, each a fresh process) and its
ratio to `python -c pass` (the floor) and to `python -c "import torch"` (what a torch import costs).

    python bench/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "circuitstat --help": [sys.executable, "-m", "circuitstat.pipelines.cli", "--help"],
    "circuitstat check --help": [sys.executable, "-m", "circuitstat.pipelines.cli", "check", "--help"],
    "circuitstat query --help": [sys.executable, "-m", "circuitstat.pipelines.cli", "query", "--help"],
    "circuitstat report --help": [sys.executable, "-m", "circuitstat.pipelines.cli", "report", "--help"],
    "circuitstat study --help": [sys.executable, "-m", "circuitstat.pipelines.cli", "study", "--help"],
}
LOADS = "import sys, circuitstat.pipelines.cli; print(sorted(m for m in ('torch', 'scipy', 'transformers') if m in sys.modules))"


def wall(cmd: list[str]) -> float:
    """Seconds one fresh process takes (it must succeed)."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for _ in range(args.repeats):  # interleaved, so drift of a shared machine hits every command alike
        for name, cmd in COMMANDS.items():
            times[name].append(wall(cmd))
    floor = statistics.median(times["python -c pass (floor)"])
    torch_s = statistics.median(times["python -c 'import torch'"])
    print(f"median of {args.repeats} fresh processes each; ratios to the interpreter floor and to importing torch")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:<30} {m:6.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})  "
              f"x{m / floor:5.2f} floor  x{m / torch_s:5.2f} torch import")
    loaded = subprocess.run([sys.executable, "-c", LOADS], check=True, capture_output=True, text=True).stdout.strip()
    print(f"heavy modules loaded by importing the CLI: {loaded}")


if __name__ == "__main__":
    main()
