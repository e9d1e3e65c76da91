"""Architecture search targets (issue 19), on CPU, in one process, side by side:

1. LeNet-5 (configs/<dataset>/lenet5.yml) trained for `--epochs` epochs: test accuracy and
   parameters, the baseline.
2. A first-order DARTS search (DartsNetwork, `--cells` cells of `--channels` channels) for
   `--search-epochs` epochs, then its derived.yml trained from scratch exactly as LeNet-5 is
   (same epochs, data, seed): test accuracy, parameters, search wall time.
3. The same with the second order (`--orders first second`): its cost beside the first
   order's, and its result.
4. Regularized evolution through `loom search --sampler evolution` over the same cell space
   (every edge's operation and input, the channels, the learning rate): `--evaluations`
   architectures of `--evolution-cells` cells, each trained `--evolution-epochs` epochs on
   `--evolution-subset` images and scored on validation accuracy; the Pareto front of accuracy
   against parameters, printed and drawn in the search's search.html.

The issue's target is Fashion-MNIST (Debian's dataset-fashion-mnist) at full size within 15
CPU minutes of search; `--dataset mnist` uses the packaged MNIST where that package is not
installed, and the subset flags shrink every part to what a shared machine affords. Every
figure printed says which data and sizes it was measured on.

    python benchmarks/nas.py --dataset fashion_mnist --train-subset 0 ...  # the full target
    python benchmarks/nas.py --dataset mnist --train-subset 4000 --epochs 3 ...  # a small run
    python benchmarks/nas.py --genotype benchmarks/genotypes/fashion_mnist_first_order.yml \
        --skip evolution --threads 1  # a cell found earlier, trained on the whole split
"""

from __future__ import annotations

import argparse
import os
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
from torchloom.zoo.nas.genotype import OPERATIONS, Genotype, random_genotype

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def data_overrides(args: argparse.Namespace, train_subset: int | None = None) -> list[str]:
    subsets = {
        "training": args.train_subset if train_subset is None else train_subset,
        "validation": args.validation_subset,
        "test": args.test_subset,
    }
    return [f"++{s}.task.subset={n}" for s, n in subsets.items() if n] + [
        f"++training.task.data_folder={args.data}",
        f"++training.seed={args.seed}",
        "++training.logging_interval=1000",
    ]


def parameters(config: Path) -> int:
    pipeline = build_checked(load_config(config), ())
    return sum(p.numel() for p in pipeline.components["image_classifier"].parameters())


def train(config: Path, overrides: list[str], expdir: Path) -> tuple[dict[str, Any], float]:
    started, cpu = time.perf_counter(), time.process_time()
    result = torchloom.train(config, overrides, expdir=str(expdir), analysis=False)
    seconds = time.perf_counter() - started
    print(f"  ({seconds:.0f} s wall, {time.process_time() - cpu:.0f} s CPU, {load()})", flush=True)
    return result.summary, seconds


def load() -> str:
    """The machine's load average: the benchmark shares its CPUs with other work."""
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


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
    if args.genotype:  # a cell an earlier search found: trained again, not searched again
        genotype = Genotype.model_validate(yaml.safe_load(args.genotype.read_text()))
        searched_in = f"{order} order, searched earlier ({args.genotype})"
        trained(args, genotype, searched_in, folder / f"derived_{order}", common)
        return
    config = search_config(args, order, folder)
    # The search run's own validation and test passes only report on the searching network:
    # small subsets keep its time on the search itself.
    searched = [
        *data_overrides(args, args.search_train_subset),
        f"++validation.task.subset={args.search_eval_subset}",
        f"++test.task.subset={args.search_eval_subset}",
    ]
    summary, seconds = train(config, searched, folder / f"search_{order}")
    (run,) = (folder / f"search_{order}").glob("*/*/derived.yml")
    genotype = Genotype.model_validate(yaml.safe_load(run.with_name("genotype.yml").read_text()))
    if "derived" in args.skip:  # the search's cost only
        print(
            f"DARTS {order} order: search {seconds:.0f} s ({summary['epochs']} epochs, "
            f"{summary['episodes']} steps); genotype {genotype.yaml_data()}",
            flush=True,
        )
        return
    searched_in = (
        f"{order} order, search {seconds:.0f} s ({summary['epochs']} epochs, "
        f"{summary['episodes']} steps)"
    )
    trained(args, genotype, searched_in, folder / f"derived_{order}", common)


def trained(
    args: argparse.Namespace, genotype: Genotype, searched_in: str, folder: Path, common: list[str]
) -> None:
    """The derived network of `genotype` trained from scratch exactly as LeNet-5 is."""
    folder.mkdir()
    derived = fixed_config(args, genotype, folder / "derived.yml")
    epochs = [f"training.terminal_conditions.epoch_limit={args.epochs}"]
    result, train_seconds = train(derived, common + epochs, folder)
    print(
        f"DARTS {searched_in}: derived network {parameters(derived):,} parameters, "
        f"test accuracy {result['final']['test']['accuracy']:.4f} after {result['epochs']} "
        f"epochs ({train_seconds:.0f} s); genotype {genotype.yaml_data()}",
        flush=True,
    )


def evolution_config(args: argparse.Namespace, path: Path) -> Path:
    """The regularized-evolution search as a `loom search` config: a DartsFixedNetwork whose
    genotype edges (operation and input node of each), channels and learning rate are the
    search parameters, `sampler: evolution`. Each trial trains `--evolution-epochs` epochs on
    `--evolution-subset` training images at batch 32 and is scored on validation accuracy."""
    genotype = random_genotype(random.Random(0))  # replaced whole by every trial's values
    space: dict[str, Any] = {
        "sampler": {
            "type": "evolution",
            "population_size": args.population,
            "sample_size": args.sample,
        },
        "monitor": "validation.accuracy",
        "mode": "max",
    }
    for kind in ("normal", "reduce"):
        for index in range(len(genotype.edges(kind))):
            node = index // 2 + 2
            key = f"pipeline.image_classifier.genotype.{kind}.{index}"
            space[f"{key}.0"] = {"choice": list(OPERATIONS)}
            space[f"{key}.1"] = {"choice": list(range(node))}
    space["pipeline.image_classifier.channels"] = {"choice": args.evolution_channels}
    space["training.optimizer.lr"] = {"choice": [5.0e-4, 1.0e-3, 2.0e-3, 4.0e-3]}
    return write(
        path,
        {
            "default_configs": [f"loom://{args.dataset}/default_{args.dataset}.yml"],
            "name": f"evolution_{args.dataset}",
            "training": {
                "task": {"subset": args.evolution_subset, "data_folder": args.data},
                "dataloader": {"batch_size": 32},
                "seed": 0,
                "logging_interval": 1000,
                "terminal_conditions": {
                    "epoch_limit": args.evolution_epochs,
                    "early_stopping": None,
                },
            },
            "validation": {"task": {"subset": args.validation_subset or None}},
            "pipeline": {
                "image_classifier": {
                    "type": "DartsFixedNetwork",
                    "cells": args.evolution_cells,
                    "channels": args.evolution_channels[-1],
                    "genotype": genotype.yaml_data(),
                    "globals": {"prediction_size": "num_classes"},
                },
                "loss": {"type": "CrossEntropyLoss"},
                "accuracy": {"type": "AccuracyStatistics"},
            },
            "search": space,
        },
    )


def evolution(args: argparse.Namespace) -> None:
    """`loom search --sampler evolution` (torchloom.search) over the DARTS cell space; the
    Pareto front of validation accuracy against parameters is printed and drawn into the
    search's search.html (plots/pareto.png)."""
    from torchloom.search.pareto import PARAMETERS, front, measured
    from torchloom.search.record import read_record
    from torchloom.search.results import open_study

    config = evolution_config(args, args.out / "evolution.yml")
    started, cpu = time.perf_counter(), time.process_time()
    found = torchloom.search(
        config, overrides=["~test"], trials=args.evaluations, seed=0, expdir=str(args.out)
    )
    seconds = time.perf_counter() - started
    study = open_study(found.search_dir, read_record(found.search_dir))
    trials = measured(study)
    values = sorted(float(t.value) for t in trials if t.value is not None)
    print(
        f"regularized evolution (loom search --sampler evolution): {len(trials)} architectures "
        f"completed of {len(study.trials)} in {seconds:.0f} s wall, "
        f"{time.process_time() - cpu:.0f} s CPU ({load()}); population {args.population}, "
        f"sample {args.sample}; validation accuracy {values[0]:.4f} to {values[-1]:.4f} "
        f"(median {values[len(values) // 2]:.4f}); best trial {found.best_value:.4f}",
        flush=True,
    )
    for trial in front(trials, "max"):
        origin = trial.system_attrs.get("evolution", {}).get("parent")
        print(
            f"  Pareto: trial {trial.number:>3} {trial.user_attrs[PARAMETERS]:>8,} parameters "
            f"{trial.value:.4f} (parent {origin})"
        )
    print(f"  search.html: {found.search_dir / 'search.html'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["fashion_mnist", "mnist"], default="fashion_mnist")
    parser.add_argument("--data", default=None, help="data folder (default ~/data/<dataset>)")
    parser.add_argument("--train-subset", type=int, default=0, help="0: the whole split")
    parser.add_argument(
        "--search-train-subset",
        type=int,
        default=None,
        help="training images of a DARTS search, halved between weights and alphas "
        "(default: --train-subset)",
    )
    parser.add_argument(
        "--search-eval-subset", type=int, default=500, help="a search run's validation and test"
    )
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
    parser.add_argument("--evolution-epochs", type=int, default=2)
    parser.add_argument("--evolution-subset", type=int, default=1500, help="training images")
    parser.add_argument("--evolution-cells", type=int, default=3)
    parser.add_argument("--evolution-channels", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["lenet", "darts", "derived", "evolution"]
    )
    parser.add_argument(
        "--genotype",
        type=Path,
        default=None,
        help="a genotype.yml an earlier search wrote: train that cell instead of searching",
    )
    parser.add_argument("--seed", type=int, default=0, help="every training's seed")
    parser.add_argument("--out", type=Path, default=Path("runs") / "nas_benchmark")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    args.data = args.data or f"~/data/{args.dataset.replace('_', '-')}"
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    random.seed(0)
    common = data_overrides(args)
    print(
        f"data: {args.dataset}, {' '.join(common)}; {args.threads} thread(s), {load()}", flush=True
    )
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
            evolution(args)


if __name__ == "__main__":
    main()
