"""The trainer: ``python -m train`` (see ``train/__main__.py``).

Outcome + process rewards and step-index group normalization
(:mod:`train.advantage`), veRL's PPO loss (:mod:`train.loss`), an embedded
single-process backend with overlapped rollout and training
(:mod:`train.local`), and the distributed veRL backend (:mod:`train.verl_backend`).
"""
