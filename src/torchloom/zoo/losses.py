"""Classification losses: thin components over `torch.nn.functional`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from torchloom.core.component import Batch, ComponentParams, Loss
from torchloom.core.streams import FLOATING, StreamSpec


class NLLLossParams(ComponentParams):
    ignore_index: int = Field(
        -100, description="Target value that contributes neither to the loss nor its gradient."
    )


class CrossEntropyLossParams(NLLLossParams):
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of the target probability spread evenly over all classes.",
    )


def _classification_input_specs() -> dict[str, StreamSpec]:
    return {
        "predictions": StreamSpec(("batch", "classes"), FLOATING, "class scores per sample"),
        "targets": StreamSpec(("batch",), torch.int64, "class index per sample"),
    }


def _full_precision(predictions: torch.Tensor) -> torch.Tensor:
    # Under autocast a model may emit float16/bfloat16: the loss is computed in float32 so that
    # its value and gradients keep their precision (and it meets the Loss output spec).
    if predictions.dtype in (torch.float16, torch.bfloat16):
        return predictions.float()
    return predictions


class NLLLoss(Loss):
    """Negative log-likelihood of the target classes, averaged over the batch.

    Expects log-probabilities, i.e. a model ending in log_softmax (the default of `LeNet5`
    and `FeedForwardNetwork`); use `CrossEntropyLoss` for raw logits.

    ```yaml
    pipeline:
      nllloss:
        type: NLLLoss
        streams: {predictions: predictions, targets: targets}
    ```
    """

    Params = NLLLossParams
    params: NLLLossParams

    def input_specs(self) -> dict[str, StreamSpec]:
        return _classification_input_specs()

    def forward(self, inputs: Batch) -> Batch:
        predictions = _full_precision(inputs["predictions"])
        loss = F.nll_loss(predictions, inputs["targets"], ignore_index=self.params.ignore_index)
        return {"loss": loss}


class CrossEntropyLoss(Loss):
    """Cross-entropy of raw class scores (logits) against the target classes, averaged over
    the batch, with optional label smoothing.

    Give it a model with `log_softmax: false`. (On log-probabilities it gives the same value
    as `NLLLoss`, since log_softmax of log-probabilities changes nothing, only slower.)

    ```yaml
    pipeline:
      classifier: {type: FeedForwardNetwork, log_softmax: false}
      loss: {type: CrossEntropyLoss, label_smoothing: 0.1}
    ```
    """

    Params = CrossEntropyLossParams
    params: CrossEntropyLossParams

    def input_specs(self) -> dict[str, StreamSpec]:
        return _classification_input_specs()

    def forward(self, inputs: Batch) -> Batch:
        loss = F.cross_entropy(
            _full_precision(inputs["predictions"]),
            inputs["targets"],
            ignore_index=self.params.ignore_index,
            label_smoothing=self.params.label_smoothing,
        )
        return {"loss": loss}
