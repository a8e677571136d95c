"""The trainer: ``python -m train`` (see ``train/__main__.py``).

Outcome + process rewards and step-index group normalization
(:mod:`train.advantage`), veRL's PPO loss (:mod:`train.loss`), an embedded
single-process backend with overlapped rollout and training
(:mod:`train.local`), and the distributed veRL backend (:mod:`train.verl_backend`).
"""

import warnings

# veRL's engine registry warns, at import, about every optional engine that is not installed
# (torchtitan, megatron, ...): engines no run here asks for.
warnings.filterwarnings("ignore", message=r"\w+ engine is not available", category=UserWarning,
                        module=r"verl\.workers\.engine")
