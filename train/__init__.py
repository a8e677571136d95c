"""The trainer: ``python -m train`` (see ``train/__main__.py``).

Outcome + process rewards and step-index group normalization
(:mod:`train.advantage`), veRL's PPO loss (:mod:`train.loss`), an embedded
single-process backend with overlapped rollout and training
(:mod:`train.local`), and the distributed veRL backend (:mod:`train.verl_backend`).
"""

import logging
import warnings

# veRL's engine registry warns, at import, about every optional engine that is not installed
# (torchtitan, megatron, ...): engines no run here asks for.
warnings.filterwarnings("ignore", message=r"\w+ engine is not available", category=UserWarning,
                        module=r"verl\.workers\.engine")

# veRL's platform manager logs two warnings at import on a host without an accelerator (no
# accelerator found, falling back to 'nvidia'; 'nvidia' not available): the local trainer imports
# veRL's loss functions and runs on the CPU on purpose, so they say nothing. A filter on that logger
# outlives the level veRL sets on it at import.
logging.getLogger("verl.plugin.platform.platform_manager").addFilter(
    lambda record: not record.getMessage().startswith(("No supported accelerator detected", "Platform 'nvidia'")))
