"""Accuracy targets of the shipped MNIST pipelines, trained by `torchloom.train` on CPU.

- LeNet-5: >= 97% held-out (validation) accuracy after 1 epoch, >= 99.0% test within
  10 epochs (LeCun et al. 1998 report 0.95% test error). The configs run as shipped: early
  stopping on validation.accuracy, so best.pt (used for the test pass) is the epoch with the
  best validation accuracy. The shipped configs run as shipped:
  early stopping on validation.accuracy, so best.pt (used for the test pass) is the epoch
  with the best validation accuracy.
- ConvNet (configs/mnist/convnet.yml): beat PyTorchPipe's README figure, 0.9577.
Prints one line per target with the measured figure, epochs and wall time.

    python benchmarks/accuracy.py [--data ~/data/mnist]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torchloom

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "mnist"


def train(config: str, epochs: int, data: str, expdir: str) -> tuple[dict, float]:
    start = time.perf_counter()
    result = torchloom.train(
        CONFIGS / config,
        [
            f"training.terminal_conditions.epoch_limit={epochs}",
            "+training.seed=0",
            f"training.task.data_folder={data}",
        ],
        expdir=expdir,
        analysis=False,
    )
    return result.summary, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="~/data/mnist")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as expdir:
        one, seconds = train("lenet5.yml", 1, args.data, expdir)
        print(
            f"LeNet-5, 1 epoch: validation accuracy {one['final']['validation']['accuracy']:.4f}"
            f" (target >= 0.97), test {one['final']['test']['accuracy']:.4f}, {seconds:.0f} s"
        )
        ten, seconds = train("lenet5.yml", 10, args.data, expdir)
        monitor = ten["monitor"]
        print(
            f"LeNet-5, up to 10 epochs: test accuracy {ten['final']['test']['accuracy']:.4f} "
            f"(target >= 0.990) with best.pt by {monitor['name']} = {monitor['best']:.4f} "
            f"(epoch {monitor['best_epoch']}), {ten['epochs']} epochs ({ten['status']}), "
            f"{seconds:.0f} s"
        )
        convnet, seconds = train("convnet.yml", 10, args.data, expdir)
        print(
            f"ConvNet, 10 epochs: test accuracy {convnet['final']['test']['accuracy']:.4f} "
            f"(PyTorchPipe README: 0.9577), {seconds:.0f} s"
        )


if __name__ == "__main__":
    main()
