"""Samples exported before training, to check the data before trusting a model with it.

    reports/samples/random_<section>.png   `random_samples.count` random samples with labels
    reports/samples/augmentation.png       one training sample through `augmentation.count`
                                           draws of the task's random transforms

Images come from the output's images stream (else the task's only image stream); a task
without images but with the output's texts stream gets a markdown table (`.md`) instead. A
training task without random transforms gets no augmentation grid (it would show one picture
`count` times): the run says "no random transforms" instead (see skipped.py), as it does for
anything else that cannot be shown.

Random ids come from a private generator seeded from the run's seed; the augmentation draws
run the task's transforms, which draw from the global generators, inside `preserved_rng`. The
run's random streams are untouched either way: training with this hook is bit-identical to
training without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchloom.analysis.image_grid import (
    class_label,
    class_names,
    fetch_samples,
    image_key,
    markdown_cell,
    save_grid,
    task_key,
)
from torchloom.analysis.schema import AnalysisConfig, AugmentationConfig, SampleExportConfig
from torchloom.analysis.skipped import say_skipped
from torchloom.core.component import Batch, Task
from torchloom.data.atomic_files import write_text_atomic
from torchloom.engine.state import Hook

if TYPE_CHECKING:
    from torchloom.engine.state import RunView

# Offsets of the run seed, so these draws never coincide with one the run makes.
RANDOM_SAMPLES_SEED = 0x5A3D
AUGMENTATION_SEED = 0xA06
RANDOMNESS_DRAWS = 16  # draws of the augmented sample that tell random transforms apart

TARGETS = "targets"  # the default key of class indices in a classification task's samples


def random_ids(size: int, count: int, seed: int) -> list[int]:
    """`count` distinct sample ids (all when the task is smaller), the same for a seed."""
    generator = torch.Generator().manual_seed(seed + RANDOM_SAMPLES_SEED)
    return [int(i) for i in torch.randperm(size, generator=generator)[:count]]


def augmentations(task: Task, index: int, count: int, seed: int) -> list[Batch]:
    """Sample `index` read `count` times through the task (its random transforms drawn anew
    each time); the same draws for a seed, and the run's generators left as they were."""
    return fetch_samples(task, [index] * count, seed=seed + AUGMENTATION_SEED)


class SampleExport(Hook):
    """Before training: a grid of random samples, and a grid of augmentations of one sample."""

    name = "sample_export"

    def __init__(self, config: AnalysisConfig) -> None:
        self.config = config
        random_settings = config.settings("random_samples")
        augmentation = config.settings("augmentation")
        assert isinstance(random_settings, SampleExportConfig)
        assert isinstance(augmentation, AugmentationConfig)
        self.random_settings, self.augmentation = random_settings, augmentation

    def before_train(self, run: RunView) -> None:
        if run.progress.episode > 0:  # resumed: the pictures are there since the start
            return
        if self.config.enabled("random_samples"):
            self._random_samples(run)
        if self.config.enabled("augmentation"):
            self._augmentation(run)

    def _random_samples(self, run: RunView) -> None:
        section = self.random_settings.section
        loader = getattr(run, "train_data" if section == "training" else f"{section}_data")
        if loader is None:
            why = f"the run has no {section} section (analysis.random_samples.section: {section})"
            say_skipped(run, ["random_samples"], why)
            return
        task = loader.task
        ids = random_ids(len(task), self.random_settings.count, run.seed)
        samples = fetch_samples(task, ids, seed=run.seed + RANDOM_SAMPLES_SEED)
        captions = [f"#{i}" for i in ids]
        self._save(run, "random_samples", task, samples, captions, f"random_{section}.png")

    def _augmentation(self, run: RunView) -> None:
        task = run.train_data.task
        index = self.augmentation.sample
        if index >= len(task):
            why = (
                f"sample {index} does not exist (the training task has {len(task)}); "
                "set analysis.augmentation.sample"
            )
            say_skipped(run, ["augmentation"], why)
            return
        count = self.augmentation.count
        # More draws than shown, so that a task whose transforms are random is not taken for
        # one without by chance (a coin-flip transform repeats 16 times in 1 of 32,768 runs).
        samples = augmentations(task, index, max(count, RANDOMNESS_DRAWS), run.seed)
        if all(_same_sample(samples[0], other) for other in samples[1:]):
            why = (
                f"the training task has no random transforms: {len(samples)} draws of sample "
                f"{index} are all the same (add random transforms to training.task, or switch "
                "analysis.augmentation off)"
            )
            say_skipped(run, ["augmentation"], why)
            return
        captions = [f"#{index} draw {n + 1}" for n in range(count)]
        self._save(run, "augmentation", task, samples[:count], captions, "augmentation.png")

    def _save(
        self,
        run: RunView,
        item: str,
        task: Task,
        samples: list[Batch],
        captions: list[str],
        file: str,
    ) -> None:
        """A grid PNG of the samples' images, or a markdown table of their texts."""
        if not samples:  # an empty task
            say_skipped(run, [item], f"{task.label} has no samples")
            return
        output = self.config.outputs[0]
        targets = task_key(task, output.targets) or TARGETS
        names = class_names(run.pipeline, output)
        labels = []
        for sample in samples:
            target = sample.get(targets)
            if isinstance(target, torch.Tensor) and target.numel() == 1:
                target = int(target)
            labels.append(class_label(target, names) if isinstance(target, int) else "")
        path = run.run_dir / "reports" / "samples" / file
        images, texts = image_key(task, output.images), task_key(task, output.texts)
        if images is not None:
            captioned = [
                f"{c}\n{label}" if label else c for c, label in zip(captions, labels, strict=True)
            ]
            save_grid([s[images] for s in samples], captioned, path)
        elif texts is not None:
            lines = ["| sample | label | text |", "|---|---|---|"]
            for caption, label, sample in zip(captions, labels, samples, strict=True):
                text = markdown_cell(sample[texts])
                lines.append(f"| {caption} | {markdown_cell(label)} | {text} |")
            write_text_atomic(path.with_suffix(".md"), "\n".join(lines) + "\n")
        else:  # e.g. a task of vectors: nothing a person could look at
            why = (
                f"{task.label} has no image or texts stream to show; name one under "
                "analysis.outputs (images: STREAM or texts: STREAM)"
            )
            say_skipped(run, [item], why)


def _same_sample(a: Batch, b: Batch) -> bool:
    """Whether two reads of a sample are equal in every stream."""
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor) or isinstance(other, torch.Tensor):
            if not (
                isinstance(value, torch.Tensor)
                and isinstance(other, torch.Tensor)
                and value.shape == other.shape
                and torch.equal(value, other)
            ):
                return False
        elif value != other:
            return False
    return True
