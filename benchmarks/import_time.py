"""Start-up cost of the `loom` commands against `import torch`, measured side by side.

Each command runs in a fresh interpreter, alternating with the others, several times; medians
are compared. Targets (#15): `loom components` (the list) <= 1.0 s and without torch;
`loom check configs/mnist/lenet5.yml` <= 1.5x `import torch`; `loom --help` without torch;
`import torchloom` and the training API at most 0.3 s over torch.

    python benchmarks/import_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

LENET = str(Path(__file__).resolve().parents[1] / "configs" / "mnist" / "lenet5.yml")
LOOM = "import sys; from torchloom.cli.main import main; sys.argv[0] = 'loom'; main()"
COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import torchloom": [sys.executable, "-c", "import torchloom"],
    "torchloom.train (engine, torch, zoo registry)": [
        sys.executable,
        "-c",
        "import torch; from torchloom import train",
    ],
    "loom --help": [sys.executable, "-c", LOOM, "--help"],
    "loom components": [sys.executable, "-c", LOOM, "components"],
    "loom check lenet5": [sys.executable, "-c", LOOM, "check", LENET],
}
# What each command imports of the heavy packages, checked once (not timed).
HEAVY_PROBE = (
    "import contextlib, io, json, sys\n"
    "from torchloom.cli.main import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules"
    " if m.split('.')[0] in ('torch', 'torchvision', 'torchmetrics')})))"
)


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_imports(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", HEAVY_PROBE, *argv], check=True, capture_output=True, text=True
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    timed(COMMANDS["import torch"])  # warm the file cache
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            samples[name].append(timed(command))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    empty = statistics.median(timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
    print(f"interpreter start: {empty:.3f} s")
    for name, value in medians.items():
        print(f"{name}: {value:.3f} s (median of {args.repeats})")
    torch_time = medians["import torch"]
    extra = medians["torchloom.train (engine, torch, zoo registry)"] - torch_time
    print(f"torchloom training API over torch: {extra:+.3f} s (target <= +0.3 s)")
    print(f"loom components: {medians['loom components']:.3f} s (target <= 1.0 s)")
    ratio = medians["loom check lenet5"] / torch_time
    print(f"loom check lenet5 / import torch: {ratio:.2f} (target <= 1.5)")
    print(f"loom --help imports: {heavy_imports('--help') or 'nothing heavy'}")
    print(f"loom components imports: {heavy_imports('components') or 'nothing heavy'}")
    print(f"loom check lenet5 imports: {heavy_imports('check', LENET)}")


if __name__ == "__main__":
    main()
