"""Deployment of a trained run folder: quantization (`loom quantize`), export (`loom export`)
and prediction on an export (`loom predict`).

- `run_model.py`: a run folder's pipeline, rebuilt from its config.yaml, with its weights.
- `graph.py`: the tensor part of a pipeline (task tensor inputs -> chosen output streams) as
  one `nn.Module` of positional tensors, what export and latency measurement run.
- `quantizer.py`: the one `Quantizer` interface and the choice of a route per model and mode;
  `eager_dynamic.py` and `eager_static.py` are the routes through `torch.ao.quantization`
  (deprecated by PyTorch: deleting those modules drops the route).
- `quantize.py`: the worker behind `loom quantize`; `measure.py`: size and latency;
  `report.py`: the reports written next to the results.
- `export.py` / `onnx_export.py`: the worker behind `loom export`; `sidecar.py`: the pre- and
  post-processing a deployment needs, as JSON; `predict.py`: `loom predict`, which needs
  only numpy, Pillow and ONNX Runtime.
"""
