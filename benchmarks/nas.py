"""Architecture search targets (issue 19), on CPU, in one process, side by side:

1. LeNet-5 (configs/<dataset>/lenet5.yml) trained for `--epochs` epochs: test accuracy and
   parameters, the baseline.
2. A first-order DARTS search (DartsNetwork, `--cells` cells of `--channels` channels) for
   `--search-epochs` epochs, then its derived.yml trained from scratch exactly as LeNet-5 is
   (same epochs, data, seed): test accuracy, parameters, search wall time.
3. The same with the second order (`--orders first second`): its cost beside the first
   order's, and its result.
4. Regularized evolution (torchloom.nas.evolution) over the same space: `--evaluations`
   architectures, each trained `--evolution-epochs` epoch(s) and scored on validation
   accuracy; the Pareto front of accuracy versus parameters, printed and plotted.

The issue's target is Fashion-MNIST (Debian's dataset-fashion-mnist) at full size within 15
CPU minutes of search; `--dataset mnist` uses the packaged MNIST where that package is not
installed, and the subset flags shrink every part to what a shared machine affords. Every
figure printed says which data and sizes it was measured on.

    python benchmarks/nas.py --dataset fashion_mnist --train-subset 0 ...  # the full target
    python benchmarks/nas.py --dataset mnist --train-subset 4000 --epochs 3 ...  # a small run
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

import torchloom
from torchloom.config import load_config
from torchloom.engine.assemble import build_checked
from torchloom.nas.evolution import Individual, RegularizedEvolution, pareto_front
from torchloom.zoo.nas.genotype import Genotype, mutate_genotype, random_genotype

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def data_overrides(args: argparse.Namespace) -> list[str]:
    subsets = {
        "training": args.train_subset,
        "validation": args.validation_subset,
        "test": args.test_subset,
    }
    return [f"++{s}.task.subset={n}" for s, n in subsets.items() if n] + [
        f"++training.task.data_folder={args.data}",
        "++training.seed=0",
        "++training.logging_interval=1000",
    ]


def parameters(config: Path) -> int:
    pipeline = build_checked(load_config(config), ())
    return sum(p.numel() for p in pipeline.components["image_classifier"].parameters())


def train(config: Path, overrides: list[str], expdir: Path) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    result = torchloom.train(config, overrides, expdir=str(expdir), analysis=False)
    return result.summary, time.perf_counter() - started


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def search_config(args: argparse.Namespace, order: str, folder: Path) -> Path:
    return write(
        folder / f"search_{order}.yml",
        {
            "default_configs": [f"loom://{args.dataset}/default_{args.dataset}.yml"],
            "name": f"darts_{order}",
            "training": {
                "dataloader": {"batch_size": 32},
                "optimizer": {"type": "SGD", "lr": 0.025, "momentum": 0.9, "weight_decay": 3e-4},
                "scheduler": {"type": "CosineAnnealingLR", "T_max": args.search_epochs},
                "gradient_clipping": {"norm": 5.0},
                "terminal_conditions": {"epoch_limit": args.search_epochs, "early_stopping": None},
                "architecture_search": {"order": order, "split": 0.5},
            },
            "pipeline": {
                "image_classifier": {
                    "type": "DartsNetwork",
                    "cells": args.cells,
                    "channels": args.channels,
                    "globals": {"prediction_size": "num_classes"},
                },
                "loss": {"type": "CrossEntropyLoss"},
                "accuracy": {"type": "AccuracyStatistics"},
            },
        },
    )


def fixed_config(args: argparse.Namespace, genotype: Genotype, path: Path) -> Path:
    """A DartsFixedNetwork of `genotype` in LeNet-5's config (its optimizer, epochs, data)."""
    base = yaml.safe_load((CONFIGS / args.dataset / "lenet5.yml").read_text(encoding="utf-8"))
    base["default_configs"] = [f"loom://{args.dataset}/default_{args.dataset}.yml"]
    base["pipeline"] = {
        "image_classifier": {
            "type": "DartsFixedNetwork",
            "cells": args.cells,
            "channels": args.channels,
            "genotype": genotype.yaml_data(),
            "globals": {"prediction_size": "num_classes"},
        },
        "loss": {"type": "CrossEntropyLoss"},
        "accuracy": {"type": "AccuracyStatistics"},
    }
    return write(path, base)


def darts(args: argparse.Namespace, order: str, folder: Path, common: list[str]) -> None:
    config = search_config(args, order, folder)
    summary, seconds = train(config, common, folder / f"search_{order}")
    (run,) = (folder / f"search_{order}").glob("*/*/derived.yml")
    genotype = Genotype.model_validate(yaml.safe_load(run.with_name("genotype.yml").read_text()))
    derived = fixed_config(args, genotype, folder / f"derived_{order}.yml")
    epochs = [f"training.terminal_conditions.epoch_limit={args.epochs}"]
    result, train_seconds = train(derived, common + epochs, folder / f"derived_{order}")
    print(
        f"DARTS {order} order: search {seconds:.0f} s ({summary['epochs']} epochs, "
        f"{summary['episodes']} steps), derived network {parameters(derived):,} parameters, "
        f"test accuracy {result['final']['test']['accuracy']:.4f} after {result['epochs']} "
        f"epochs ({train_seconds:.0f} s); genotype {genotype.yaml_data()}",
        flush=True,
    )


def evolution(args: argparse.Namespace, folder: Path, common: list[str]) -> None:
    runs = folder / "evolution"
    epochs = [f"training.terminal_conditions.epoch_limit={args.evolution_epochs}"]

    def evaluate(genotype: Genotype) -> tuple[float, int]:
        config = fixed_config(args, genotype, folder / "candidate.yml")
        summary, _ = train(config, common + epochs, runs)
        return float(summary["final"]["validation"]["accuracy"]), parameters(config)

    search = RegularizedEvolution(
        args.population, args.sample, random_genotype, mutate_genotype, seed=0
    )
    started = time.perf_counter()
    while len(search.history) < args.evaluations:
        accuracy, count = evaluate(search.ask())
        search.tell(accuracy, parameters=count)
    seconds = time.perf_counter() - started
    front = pareto_front(search.history, lambda i: (i.fitness, -i.extra["parameters"]))
    front.sort(key=lambda i: i.extra["parameters"])
    print(
        f"regularized evolution: {len(search.history)} architectures in {seconds:.0f} s "
        f"(population {args.population}, sample {args.sample}); best validation accuracy "
        f"{search.best().fitness:.4f} ({search.best().extra['parameters']:,} parameters)"
    )
    for individual in front:
        count = individual.extra["parameters"]
        print(f"  Pareto: {count:>8,} parameters  {individual.fitness:.4f}")
    plot_front(search.history, front, args.out / "nas_pareto.png")


def plot_front(history: list[Individual[Any]], front: list[Individual[Any]], path: Path) -> None:
    from torchloom.analysis.plotting import CURVE_MARGINS, figure, save_png

    fig = figure(6, 4, CURVE_MARGINS)
    ax = fig.add_subplot()
    ax.scatter([i.extra["parameters"] for i in history], [i.fitness for i in history], s=12)
    ax.plot([i.extra["parameters"] for i in front], [i.fitness for i in front], "r.-")
    ax.set_xlabel("parameters")
    ax.set_ylabel("validation accuracy")
    ax.set_title("regularized evolution: all evaluated (blue), Pareto front (red)")
    points = [(i.extra["parameters"], i.fitness) for i in history]
    save_png(fig, path, {"points": points})
    print(f"  plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["fashion_mnist", "mnist"], default="fashion_mnist")
    parser.add_argument("--data", default=None, help="data folder (default ~/data/<dataset>)")
    parser.add_argument("--train-subset", type=int, default=0, help="0: the whole split")
    parser.add_argument("--validation-subset", type=int, default=0)
    parser.add_argument("--test-subset", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=15, help="LeNet-5's and the derived's")
    parser.add_argument("--search-epochs", type=int, default=2)
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument(
        "--orders", nargs="+", default=["first"], choices=["first", "second"], help="searches run"
    )
    parser.add_argument("--evaluations", type=int, default=30)
    parser.add_argument("--population", type=int, default=10)
    parser.add_argument("--sample", type=int, default=3)
    parser.add_argument("--evolution-epochs", type=int, default=1)
    parser.add_argument("--skip", nargs="*", default=[], choices=["lenet", "darts", "evolution"])
    parser.add_argument("--out", type=Path, default=Path("runs") / "nas_benchmark")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    args.data = args.data or f"~/data/{args.dataset.replace('_', '-')}"
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    random.seed(0)
    common = data_overrides(args)
    print(f"data: {args.dataset}, {' '.join(common)}; {args.threads} thread(s)", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        if "lenet" not in args.skip:
            lenet = CONFIGS / args.dataset / "lenet5.yml"
            epochs = [f"training.terminal_conditions.epoch_limit={args.epochs}"]
            summary, seconds = train(lenet, common + epochs, folder / "lenet")
            print(
                f"LeNet-5: {parameters(lenet):,} parameters, test accuracy "
                f"{summary['final']['test']['accuracy']:.4f} after {summary['epochs']} epochs "
                f"({seconds:.0f} s)",
                flush=True,
            )
        if "darts" not in args.skip:
            for order in args.orders:
                darts(args, order, folder, common)
        if "evolution" not in args.skip:
            evolution(args, folder, common)


if __name__ == "__main__":
    main()
