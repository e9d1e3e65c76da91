"""Import cost: `import torchloom` and the training API versus `import torch` alone.

Each import runs in a fresh interpreter, alternating, several times; medians are compared.
Target: torchloom costs at most 0.3 s more than torch. Last line prints the difference.

    python benchmarks/import_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STATEMENTS = {
    "torch": "import torch",
    "torchloom": "import torchloom",
    "torchloom.train (engine, torch, zoo registry)": "import torch; from torchloom import train",
    "loom --help path": "from torchloom.cli.main import build_parser; build_parser()",
}


def timed(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    timed("import torch")  # warm the file cache
    samples: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.repeats):
        for name, statement in STATEMENTS.items():
            samples[name].append(timed(statement))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = sys.executable + " -c 'pass'"
    empty = statistics.median(timed("pass") for _ in range(args.repeats))
    print(f"interpreter start ({base}): {empty:.3f} s")
    for name, value in medians.items():
        print(f"{name}: {value:.3f} s")
    extra = medians["torchloom.train (engine, torch, zoo registry)"] - medians["torch"]
    print(f"torchloom training API over torch: {extra:+.3f} s")


if __name__ == "__main__":
    main()
