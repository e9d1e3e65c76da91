"""Classification losses: thin components over `torch.nn.functional`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import Batch, ComponentParams, Loss
from torchloom.core.streams import FLOATING, StreamSpec


class NLLLossParams(ComponentParams):
    ignore_index: int = Field(
        -100,
        description="Target value that contributes neither to the loss nor its gradient "
        "(set it to the <PAD> index, 0, for targets padded by SentenceIndexer).",
    )
    sequence: bool = Field(
        False,
        description="Predictions are per step, [batch, -1, classes], with targets "
        "[batch, -1]: the loss is the mean over every counted (not ignored) step of the batch.",
    )


class CrossEntropyLossParams(NLLLossParams):
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of the target probability spread evenly over all classes.",
    )


def _classification_input_specs(sequence: bool = False) -> dict[str, StreamSpec]:
    if sequence:
        return {
            "predictions": StreamSpec(
                ("batch", -1, "classes"), FLOATING, "class scores per sample and step"
            ),
            "targets": StreamSpec(("batch", -1), torch.int64, "class index per sample and step"),
        }
    return {
        "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
        "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
    }


def _flat(predictions: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence predictions [batch, steps, classes] and targets [batch, steps] as one long
    batch of steps: the functional losses want the classes second, and a flat view averages
    over every counted step of the batch exactly as [batch, classes, steps] would."""
    if predictions.dim() == 3:
        return predictions.reshape(-1, predictions.shape[-1]), targets.reshape(-1)
    return predictions, targets


def _full_precision(predictions: torch.Tensor) -> torch.Tensor:
    # Under autocast a model may emit float16/bfloat16: the loss is computed in float32 so that
    # its value and gradients keep their precision (and it meets the Loss output spec).
    if predictions.dtype in (torch.float16, torch.bfloat16):
        return predictions.float()
    return predictions


class _MeanOverTargets(Loss):
    """A loss averaged over the targets it counts: those that are not `ignore_index`."""

    params: NLLLossParams

    def elements(self, batch: Batch) -> torch.Tensor:
        return (batch[self.stream_name("targets")] != self.params.ignore_index).sum()

    def _mean(self, summed: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss summed over the counted targets, over their count: 0, not NaN, for a batch
        that counts none (every target ignored: a masked head's batch), whose gradient is 0
        either way; torch's mean is NaN there, which the divergence check stops a run on."""
        return summed / (targets != self.params.ignore_index).sum().clamp(min=1)


class NLLLoss(_MeanOverTargets):
    """Negative log-likelihood of the target classes, averaged over the batch.

    Expects log-probabilities, i.e. a model ending in log_softmax (the default of `LeNet5`
    and `FeedForwardNetwork`); use `CrossEntropyLoss` for raw logits.

    Streams: `predictions` [batch, classes] and `targets` [batch] (int64) in, `loss` [] out.
    With `sequence: true` (decoders, per-step taggers, language models) `predictions` is
    [batch, -1, classes] and `targets` [batch, -1]: the loss averages over every step whose
    target is not `ignore_index`, so padding is left out when `ignore_index` names it.

    ```yaml
    pipeline:
      nllloss:
        type: NLLLoss
        streams: {predictions: predictions, targets: targets}
      # a decoder's per-word loss, padding (<PAD> = 0) left out:
      sequence_loss: {type: NLLLoss, sequence: true, ignore_index: 0}
    ```
    """

    Params = NLLLossParams
    params: NLLLossParams

    def input_specs(self) -> dict[str, StreamSpec]:
        return _classification_input_specs(self.params.sequence)

    def forward(self, inputs: Batch) -> Batch:
        predictions, targets = _flat(_full_precision(inputs["predictions"]), inputs["targets"])
        summed = F.nll_loss(
            predictions, targets, ignore_index=self.params.ignore_index, reduction="sum"
        )
        return {"loss": self._mean(summed, targets)}


class CrossEntropyLoss(_MeanOverTargets):
    """Cross-entropy of raw class scores (logits) against the target classes, averaged over
    the batch, with optional label smoothing.

    Give it a model with `log_softmax: false`. (On log-probabilities it gives the same value
    as `NLLLoss`, since log_softmax of log-probabilities changes nothing, only slower.)
    Streams and `sequence: true` (per-step predictions [batch, -1, classes], targets
    [batch, -1]) as for `NLLLoss`.

    ```yaml
    pipeline:
      classifier: {type: FeedForwardNetwork, log_softmax: false}
      loss: {type: CrossEntropyLoss, label_smoothing: 0.1}
    ```
    """

    Params = CrossEntropyLossParams
    params: CrossEntropyLossParams

    def input_specs(self) -> dict[str, StreamSpec]:
        return _classification_input_specs(self.params.sequence)

    def forward(self, inputs: Batch) -> Batch:
        predictions, targets = _flat(_full_precision(inputs["predictions"]), inputs["targets"])
        summed = F.cross_entropy(
            predictions,
            targets,
            ignore_index=self.params.ignore_index,
            label_smoothing=self.params.label_smoothing,
            reduction="sum",
        )
        return {"loss": self._mean(summed, targets)}
