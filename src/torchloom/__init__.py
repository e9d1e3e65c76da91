"""torchloom: YAML pipelines of PyTorch components for vision and language."""

__version__ = "0.1.0"
