"""Deployment of a trained run folder: quantization (`loom quantize`), export (`loom export`)
and prediction on an export (`loom predict`).

- `run_model.py`: a run folder's pipeline, rebuilt from its config.yaml, with its weights.
- `graph.py`: the tensor part of a pipeline (task or chosen tensor inputs -> chosen output
  streams) as one `nn.Module` of positional tensors, what export and latency measurement run.
- `quantizer.py`: the one `Quantizer` interface and the choice of a route per mode;
  `eager_dynamic.py` and `eager_static.py` (static and QAT) are the routes through
  `torch.ao.quantization` (deprecated by PyTorch: deleting those modules drops the route).
- `quantize.py`: the worker behind `loom quantize`; `qat.py`: its fine-tuning through the
  engine; `measure.py`: size and latency; `report.py`: the reports written with the results;
  `output_folder.py`: result folders that appear whole or not at all.
- `export.py` / `onnx_export.py` / `aoti.py`: the worker behind `loom export`; `sidecar.py`:
  the pre- and post-processing a deployment needs, as JSON; `predict.py`: `loom predict`
  (images with numpy, Pillow and ONNX Runtime only, the sidecar's recipe checked and
  applied by `image_recipe.py`; texts through `text_inputs.py`).
"""
