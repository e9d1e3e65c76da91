"""Config loading: YAML files, `default_configs` nesting, command-line overrides, `${...}`.

    cfg = load_config("configs/mnist/lenet5.yml", ["training.optimizer.lr=0.01"])
    cfg.data["training"]["optimizer"]["lr"]           # 0.01
    cfg.where("training", "optimizer", "lr")          # "command-line override '...'"

Importing this package must stay cheap: it never imports torch.
"""

from torchloom.config.dumping import dump_config
from torchloom.config.loading import (
    PACKAGED_PREFIX,
    LoadedConfig,
    load_config,
    packaged_configs_root,
)

__all__ = ["PACKAGED_PREFIX", "LoadedConfig", "dump_config", "load_config", "packaged_configs_root"]
