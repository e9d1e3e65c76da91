"""CPU training steps with torch's transparent-huge-page allocation on and off, side by side.

torch's CPU allocator takes every tensor from the C library's posix_memalign. glibc serves a
block above its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps it when freed, so a
step whose activations are larger gets new pages for them every time, and the kernel faults in
and zeroes each 4 KiB page. With THP_MEM_ALLOC_ENABLE=1 (read by torch once, when it starts),
blocks of 2 MiB and more are page-aligned and advised to use 2 MiB pages: 512 times fewer faults.
The `loom` command sets it unless the environment already has it.

For each model, every round runs one fresh process per setting (in alternating order) that
times `--steps` training steps after two warm-up steps and reports its peak resident memory;
the script prints the median time per step of each setting and their ratio.

    python benchmarks/cpu_allocator.py [--rounds 5] [--steps 6] [--threads 2]

Models: `rn`, the Sort-of-CLEVR Relation Network's g_theta at its shipped size (batch 64, 625
pairs, three layers of 256: activations of 41 MiB), and `lenet`, LeNet-5 on MNIST-sized batches
of 64 (every tensor under 2 MiB, so huge pages should change nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STEP = r"""
import json, resource, sys, time
import torch
from torch import nn
model_name, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
if model_name == "rn":
    width = 256
    model = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(width, width), nn.ReLU())])
    inputs = torch.randn(64, 25, 25, width)
    def loss():
        return model(torch.relu(inputs)).sum(dim=(1, 2)).square().mean()
else:
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    def loss():
        return nn.functional.cross_entropy(model(images), labels)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
def step():
    optimizer.zero_grad()
    loss().backward()
    optimizer.step()
for _ in range(2):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
seconds = (time.perf_counter() - start) / steps
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "peak_mib": peak_mib}))
"""


def one_run(model: str, huge_pages: bool, steps: int, threads: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if huge_pages:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", STEP, model, str(steps), str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per process")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--models", default="rn,lenet", help="comma-separated: rn, lenet")
    args = parser.parse_args()
    for model in args.models.split(","):
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for round_index in range(args.rounds):
            order = (False, True) if round_index % 2 == 0 else (True, False)
            for huge_pages in order:
                runs[huge_pages].append(one_run(model, huge_pages, args.steps, args.threads))
        off = statistics.median(r["seconds"] for r in runs[False])
        on = statistics.median(r["seconds"] for r in runs[True])
        peak_off = max(r["peak_mib"] for r in runs[False])
        peak_on = max(r["peak_mib"] for r in runs[True])
        print(
            f"{model}: {off * 1000:.1f} ms/step default, {on * 1000:.1f} ms/step with "
            f"THP_MEM_ALLOC_ENABLE=1: ratio {on / off:.3f} (median of {args.rounds}); "
            f"peak memory {peak_off:.0f} / {peak_on:.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
