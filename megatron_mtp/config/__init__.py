"""One typed config for a run: see root.Config. `validate` checks it before any process starts."""

from megatron_mtp.config.root import Config, config_from_dict, load_config

__all__ = ["Config", "load_config", "config_from_dict"]
