"""Search targets (issue 17), each printed as a ratio or a verdict on its last line:

- importance: PED-ANOVA (and fANOVA) on a synthetic objective, loss = 3x + 2y + z + 0w over
  200 random trials, must rank x > y > z > w;
- overhead:   a search trial costs at most 5 % more than the same `torchloom.train` run
  (rounds alternate, in this one process, after a warm-up);
- pruning:    LeNet-5 on an MNIST subset, N trials of learning rate and batch size with the
  same random sampler seed, hyperband-pruned versus unpruned: wall-time ratio (target <= 0.4)
  and the difference of the best values (target <= 0.5 points);
- workers:    the same trials with --workers 2 versus 1 (target <= 0.6 on 2 cores).

    python benchmarks/search.py importance
    OMP_NUM_THREADS=1 python benchmarks/search.py overhead --rounds 9 --subset 4096 --epochs 2
    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/search.py pruning --trials 20 --epochs 27 \
        --subset 1024 --rounds 3
    python benchmarks/search.py workers --trials 8 --epochs 4 --subset 4096
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torchloom

CONFIG = "loom://mnist/lenet5.yml"


def importance() -> None:
    import optuna

    from torchloom.search.results import importance as evaluate

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial: optuna.Trial) -> float:
        x, y, z, w = (trial.suggest_float(n, 0, 1) for n in "xyzw")
        return 3 * x + 2 * y + z + 0 * w

    right = total = 0
    for seed in (0, 1, 2):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        study.optimize(objective, n_trials=200)
        for evaluator in ("ped-anova", "fanova"):
            scores, _ = evaluate(study, evaluator)
            order = sorted(scores, key=lambda name: -scores[name])
            shown = ", ".join(f"{n} {scores[n]:.3f}" for n in order)
            verdict = "ok" if order == ["x", "y", "z", "w"] else "WRONG ORDER"
            right, total = right + (verdict == "ok"), total + 1
            print(f"seed {seed}, {evaluator}: {shown}: {verdict}")
    print(f"x > y > z > w in {right} of {total} studies of 200 trials")


def _overrides(data: str, subset: int, epochs: int) -> list[str]:
    return [
        f"training.task.data_folder={data}",
        f"++training.task.subset={subset}",
        f"++validation.task.subset={max(subset // 4, 64)}",
        f"++test.task.subset={max(subset // 4, 64)}",
        f"training.terminal_conditions.epoch_limit={epochs}",
        "training.terminal_conditions.early_stopping=null",
        "++training.seed=1",
        "++analysis=minimal",
    ]


def overhead(rounds: int, data: str, subset: int, epochs: int) -> None:
    """A trial of one fixed value (a choice of one) versus `torchloom.train` of the config
    with that value, in alternating rounds (train first, then trial first, ...) after a
    warm-up of each, in this one process. The trial is timed as its worker spends it: asking
    the study (lock, dead-trial check, count), the sampled config, the run, telling the study;
    the search's set-up (checking the space and config, the study's creation) and its results
    (trials.csv, importance, plots, search.html) are once per search and timed apart."""
    from torchloom.search.page import write_page
    from torchloom.search.processes import run_workers
    from torchloom.search.results import write_results
    from torchloom.search.runner import SearchRequest, prepare_search

    overrides = _overrides(data, subset, epochs)
    space = {"training.optimizer.lr": {"choice": [1.0e-3]}}

    def train(folder: str) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        torchloom.train(CONFIG, overrides, expdir=folder, tensorboard=0)
        return time.perf_counter() - start, time.process_time() - cpu

    def trial(folder: str) -> tuple[float, float, float, float]:
        from torchloom.analysis.build import build_hooks

        request = SearchRequest(
            config=CONFIG, overrides=overrides, space=space, trials=1, expdir=folder
        )
        start = time.perf_counter()
        search_dir, record = prepare_search(request)
        set_up, cpu = time.perf_counter(), time.process_time()
        run_workers(search_dir, record, 1, build_hooks, lambda line: None)
        ran, cpu = time.perf_counter(), time.process_time() - cpu
        write_page(search_dir, record, write_results(search_dir, record))
        return ran - set_up, cpu, set_up - start, time.perf_counter() - ran

    with tempfile.TemporaryDirectory() as folder:
        train(f"{folder}/warm-train")
        trial(f"{folder}/warm-search")
        trains, trials, ratios, cpu_ratios = [], [], [], []
        for index in range(rounds):
            order = ("train", "trial") if index % 2 == 0 else ("trial", "train")
            for side in order:
                if side == "train":
                    train_seconds, train_cpu = train(f"{folder}/t{index}")
                    trains.append(train_seconds)
                else:
                    seconds, trial_cpu, set_up, results = trial(f"{folder}/s{index}")
                    trials.append(seconds)
            ratios.append(trials[-1] / trains[-1])
            cpu_ratios.append(trial_cpu / train_cpu)
            print(
                f"round {index} ({' then '.join(order)}): train {trains[-1]:.2f} s, trial "
                f"{trials[-1]:.2f} s: {ratios[-1]:.3f}; CPU {train_cpu:.2f} s, {trial_cpu:.2f} s: "
                f"{cpu_ratios[-1]:.3f} (once per search: set-up {set_up:.2f} s, results and page "
                f"{results:.2f} s; load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    ratio = statistics.median(trials) / statistics.median(trains)
    print(
        f"trial / train: medians of {rounds} rounds {statistics.median(trials):.2f} s / "
        f"{statistics.median(trains):.2f} s = {ratio:.3f}; median of the rounds' ratios "
        f"{statistics.median(ratios):.3f}; of the CPU times {statistics.median(cpu_ratios):.3f} "
        "(target <= 1.05)"
    )


def _search(folder: str, name: str, data: str, args: Any, pruner: str, workers: int) -> Any:
    space: dict[str, Any] = {
        "training.optimizer.lr": {"loguniform": [1.0e-4, 1.0e-1]},
        "training.dataloader.batch_size": {"choice": [32, 64, 128]},
    }
    if pruner == "hyperband" and args.reduction_factor != 3:  # 3: Optuna's default
        space["pruner"] = {"type": "hyperband", "reduction_factor": args.reduction_factor}
    return torchloom.search(
        CONFIG,
        space,
        overrides=[*_overrides(data, args.subset, args.epochs), "~training.scheduler"],
        trials=args.trials,
        sampler="random",
        pruner=None if "pruner" in space else pruner,
        seed=0,
        workers=workers,
        monitor="validation.accuracy",
        mode="max",
        expdir=f"{folder}/{name}",
    )


def pruning(args: argparse.Namespace, data: str) -> None:
    """The same N trials (random sampler, seed 0: the same learning rates and batch sizes on
    both sides) unpruned and hyperband-pruned, in alternating rounds (unpruned first, then
    hyperband first, ...), each a whole `torchloom.search` call in this process."""
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    gaps: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            times, cpu, best = {}, {}, {}
            order = ("none", "hyperband") if round_ % 2 == 0 else ("hyperband", "none")
            for pruner in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                found = _search(folder, f"r{round_}{pruner}", data, args, pruner, 1)
                times[pruner] = time.perf_counter() - start
                cpu[pruner] = time.process_time() - start_cpu
                best[pruner] = found.best_value
                states = [row["state"] for row in found.trials]
                # Epochs each trial trained: the pruned ones' step, the others' epoch limit.
                epochs = [
                    int(row["reason"].rsplit(" ", 1)[1])
                    if row["state"] == "pruned"
                    else args.epochs
                    for row in found.trials
                ]
                print(
                    f"round {round_}, {pruner}: {times[pruner]:.1f} s ({cpu[pruner]:.1f} s of "
                    f"CPU), best "
                    f"{found.best_value:.4f}, {states.count('pruned')} of {len(states)} pruned, "
                    f"{sum(epochs)} epochs trained in all (per trial: {sorted(epochs)}), "
                    f"load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            ratios.append(times["hyperband"] / times["none"])
            cpu_ratios.append(cpu["hyperband"] / cpu["none"])
            gaps.append(100 * (best["none"] - best["hyperband"]))
            print(
                f"round {round_}: hyperband / unpruned wall time {ratios[-1]:.3f}, CPU time "
                f"{cpu_ratios[-1]:.3f}; best "
                f"accuracy {best['hyperband']:.4f} vs {best['none']:.4f}: {gaps[-1]:+.2f} points",
                flush=True,
            )
    shown = ", ".join(f"{r:.3f}" for r in ratios)
    print(
        f"hyperband / unpruned wall time: median {statistics.median(ratios):.3f} (rounds: "
        f"{shown}; target <= 0.4); CPU time: median {statistics.median(cpu_ratios):.3f} "
        f"(rounds: {', '.join(f'{r:.3f}' for r in cpu_ratios)}); unpruned best minus "
        "hyperband best: "
        f"{', '.join(f'{g:+.2f}' for g in gaps)} points (target <= 0.5)"
    )


def workers(args: argparse.Namespace, data: str) -> None:
    """`loom search --workers 1` versus `--workers 2`, each a fresh `loom` process (both pay
    their start-up, as a user's command does), in alternating rounds (1 then 2, then 2 then
    1, ...) so that a machine's changing load weighs on both sides."""
    import subprocess

    source = str(Path(torchloom.__file__).parents[1])
    # One torch thread on both sides: `--workers 1` trains in the `loom` process, whose
    # default is a thread per core, while each worker of `--workers 2` has one; the ratio is
    # then the parallel trials', not the threads'.
    env = {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": "1"}
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "search_lenet5.yml"
        config.write_text(
            f"default_configs: [{CONFIG}]\n"
            "search:\n  sampler: random\n"
            "  training.optimizer.lr: {loguniform: [1.0e-4, 1.0e-1]}\n"
            "  training.dataloader.batch_size: {choice: [32, 64, 128]}\n",
            encoding="utf-8",
        )
        for round_ in range(args.rounds):
            times = {}
            for count in (1, 2) if round_ % 2 == 0 else (2, 1):
                command = [sys.executable, "-m", "torchloom.cli.main", "search", str(config)]
                command += [*_overrides(data, args.subset, args.epochs), "~training.scheduler"]
                command += ["--trials", str(args.trials), "--seed", "0", "--workers", str(count)]
                command += ["--expdir", f"{folder}/r{round_}w{count}"]
                start, used = time.perf_counter(), _children_cpu()
                subprocess.run(command, env=env, check=True, capture_output=True)
                times[count] = time.perf_counter() - start
                # CPU seconds of `loom search` and its workers: wall time x the cores they got.
                cpu = _children_cpu() - used
                print(
                    f"round {round_}: loom search --workers {count}: {times[count]:.1f} s, "
                    f"{cpu:.1f} s of CPU, {cpu / times[count]:.2f} cores on average "
                    f"(load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            ratios.append(times[2] / times[1])
    shown = ", ".join(f"{r:.3f}" for r in ratios)
    print(
        f"--workers 2 / --workers 1 wall time: median {statistics.median(ratios):.3f} "
        f"(rounds: {shown}; target <= 0.6)"
    )


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=("importance", "overhead", "pruning", "workers"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--subset", type=int, default=2048)
    parser.add_argument("--data", default=None, help="MNIST folder (default: a temporary one)")
    parser.add_argument(
        "--reduction-factor", type=int, default=3, help="hyperband's (default: Optuna's, 3)"
    )
    args = parser.parse_args()
    if args.target == "importance":
        importance()
        return
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or str(Path(scratch) / "mnist")
        if args.target == "overhead":
            overhead(args.rounds, data, args.subset, args.epochs)
        elif args.target == "pruning":
            pruning(args, data)
        else:
            workers(args, data)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
