"""Sort-of-CLEVR from perfect object descriptions: how fast g_theta/f_phi learn the questions
when perception is solved, to tell a slow CNN from a slow Relation Network.

Every image's six objects become rows [colour one-hot (6), x, y in [-1, 1], shape (0/1)] (the
paper's "state descriptions"); a Relation Network (g 4 x 256, f 256, 256, no dropout, as
RelationalNetwork computes it: every ordered pair with the question, summed) is trained with
Adam on the same generated split as the configs in configs/vqa/, and the validation accuracy
of every question subtype is printed every `--every` steps of 64 questions. `--distance` adds
each pair's centre distance to g's input (a feature the RN cannot form linearly).

    python benchmarks/sort_of_clevr_state_rn.py [--lr 1e-3] [--steps 6000] [--distance]

Plain PyTorch on purpose: it isolates the reasoning module from the CNN and the engine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchloom.data.sort_of_clevr_scenes import (
    OBJECTS,
    QUESTION_SIZE,
    QUESTION_VECTORS,
    SUBTYPES,
    generate,
)

ROW = OBJECTS + 3  # colour one-hot, x, y, shape


def descriptions(split: str, images: int, image_size: int = 75, object_size: int = 5) -> dict:
    """The object rows [n, 6, ROW] and questions (colour, subtype, answer [n, 20]) of a split."""
    arrays = generate(split, images, 10, image_size, object_size, seed=0)
    objects = torch.from_numpy(arrays["objects"].astype(np.float32))
    position = objects[..., :2] / image_size * 2 - 1
    colours = torch.eye(OBJECTS).expand(images, OBJECTS, OBJECTS)
    rows = torch.cat([colours, position, objects[..., 2:]], dim=2)
    as_long = {k: torch.from_numpy(arrays[k].astype(np.int64)) for k in ("colours", "subtypes")}
    return {
        "rows": rows,
        **as_long,
        "answers": torch.from_numpy(arrays["answers"].astype(np.int64)),
    }


class StateRelationNetwork(nn.Module):
    def __init__(self, distance: bool, width: int = 256) -> None:
        super().__init__()
        self.distance = distance
        extra = 1 if distance else 0
        layers: list[nn.Module] = [nn.Linear(2 * ROW + QUESTION_SIZE + extra, width), nn.ReLU()]
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.g = nn.Sequential(*layers)
        self.f = nn.Sequential(
            nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )

    def forward(self, rows: torch.Tensor, questions: torch.Tensor) -> torch.Tensor:
        batch, n, _ = rows.shape
        pairs = [
            rows[:, :, None].expand(batch, n, n, ROW),
            rows[:, None].expand(batch, n, n, ROW),
            questions[:, None, None].expand(batch, n, n, QUESTION_SIZE),
        ]
        if self.distance:
            offsets = (
                rows[:, :, None, OBJECTS : OBJECTS + 2] - rows[:, None, :, OBJECTS : OBJECTS + 2]
            )
            pairs.append(offsets.norm(dim=3, keepdim=True))
        return self.f(self.g(torch.cat(pairs, dim=3)).sum(dim=(1, 2)))


def questions_of(data: dict, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rows, question vectors, answers and subtypes of flat question indices (image * 20 + q)."""
    image, question = flat // 20, flat % 20
    colour, subtype = data["colours"][image, question], data["subtypes"][image, question]
    answers = data["answers"][image, question]
    return data["rows"][image], QUESTION_VECTORS[colour, subtype], answers, subtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--images", type=int, default=9800)
    parser.add_argument("--distance", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    train, validation = descriptions("train", args.images), descriptions("validation", 500)
    model = StateRelationNetwork(args.distance)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    every_question = torch.arange(validation["answers"].numel())
    start = time.perf_counter()
    print("step  loss   " + " ".join(f"{name:>14}" for name in SUBTYPES), flush=True)
    for step in range(1, args.steps + 1):
        rows, questions, answers, _ = questions_of(
            train, torch.randint(0, train["answers"].numel(), (64,))
        )
        loss = F.cross_entropy(model(rows, questions), answers)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            with torch.no_grad():
                rows, questions, answers, subtypes = questions_of(validation, every_question)
                correct = (model(rows, questions).argmax(dim=1) == answers).double()
            accuracy = torch.bincount(subtypes, correct, 6) / torch.bincount(subtypes, minlength=6)
            print(
                f"{step:>5} {loss.item():.3f} "
                + " ".join(f"{value:>14.3f}" for value in accuracy.tolist())
                + f"  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
