"""OneFlow's environment settings as the script made them, process-wide like OneFlow's env.

`flow.config` records its settings in `config_values` (gpu_device_num, machine_num, the collective
boxing thresholds, ...) and `flow.env` in `env_values` (machine, ctrl_port, world_size); they are the
dicts users see as `flow.config.values` and `flow.env.values`.  They live here, below `flow`, so the
runtime can read what the script configured: runtime/distributed.py checks the launched MPI world
against them (runtime/world.py) and takes the bucket size of the gradient all-reduces from them.

Example:
    flow.config.gpu_device_num(2)
    environment.config_values["gpu_device_num"]      # 2
"""
from __future__ import annotations

from typing import Any

config_values: dict[str, Any] = {}
env_values: dict[str, Any] = {}
