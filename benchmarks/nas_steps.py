"""Why short-trained DARTS candidates score at chance (issue 19): a DartsFixedNetwork trained
a few Adam steps, its validation accuracy in eval mode (BatchNorm's running statistics, as
validation measures it) beside train mode (the batch's own statistics), after every epoch.

    python benchmarks/nas_steps.py --dataset mnist --train 1000 --epochs 8

The network is a random genotype of 3 cells of 8 channels (as the old evolution benchmark's
candidates were); images are the first `--train` training images, batch 64, Adam 1e-3,
scored on the last 500 images of the training file (the validation split).
"""

from __future__ import annotations

import argparse
import os
import random

import torch

from torchloom.data.idx import read_idx_images, read_idx_labels
from torchloom.zoo.nas.fixed_network import DartsFixedNetwork
from torchloom.zoo.nas.genotype import random_genotype

STATISTICS = {"mnist": (0.1307, 0.3081), "fashion_mnist": (0.2860, 0.3530)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=list(STATISTICS), default="mnist")
    parser.add_argument("--data", default=None, help="folder of the IDX files")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = os.path.expanduser(args.data or f"~/data/{args.dataset.replace('_', '-')}")
    mean, std = STATISTICS[args.dataset]
    images = read_idx_images(f"{folder}/train-images-idx3-ubyte.gz").float() / 255
    images = ((images - mean) / std)[:, None]
    labels = read_idx_labels(f"{folder}/train-labels-idx1-ubyte.gz")
    train_x, train_y = images[: args.train], labels[: args.train]
    valid_x, valid_y = images[-500:], labels[-500:]
    network = DartsFixedNetwork.create(
        cells=3,
        channels=8,
        genotype=random_genotype(random.Random(0)).yaml_data(),
        globals={"input_depth": 1, "input_height": 28, "input_width": 28, "prediction_size": 10},
    )
    optimizer = torch.optim.Adam(network.parameters(), 1e-3)

    def accuracy(train_mode: bool) -> tuple[float, float]:
        network.train(train_mode)
        with torch.no_grad():
            logits = network({"inputs": valid_x})["predictions"]
        network.train(True)
        # How much the logits differ between images: near 0, every image gets one answer.
        spread = float(logits.std(0).mean())
        return float((logits.argmax(1) == valid_y).float().mean()), spread

    steps = 0
    print("steps  eval-mode accuracy (logit spread)  train-mode accuracy (logit spread)")
    for _ in range(args.epochs):
        order = torch.randperm(args.train)
        for start in range(0, args.train, 64):
            batch = order[start : start + 64]
            logits = network({"inputs": train_x[batch]})["predictions"]
            loss = torch.nn.functional.cross_entropy(logits, train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        (evaluated, spread), (trained, trained_spread) = accuracy(False), accuracy(True)
        print(
            f"{steps:>5}  {evaluated:.3f} ({spread:.3f})"
            f"{'':>21}{trained:.3f} ({trained_spread:.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
