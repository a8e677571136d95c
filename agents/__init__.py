"""Policies, their prompts and what an episode records (the loop that plays them is
:mod:`train.rollout`, above the judges).

* :mod:`agents.policy` -- ``Generation``, ``Policy``, ``make_policy``;
  backends :mod:`agents.openai_policy` and :mod:`agents.hf_policy`; the
  download-free ``tiny`` model in :mod:`agents.tiny`.
* :mod:`agents.chat` -- system prompts, message building, context truncation.
* :mod:`agents.trajectory` -- ``Step``, ``Trajectory``; :mod:`agents.recorder` -- JSONL log.
* :mod:`agents.testing` -- test doubles standing in for models and model servers.
"""

from agents.policy import Generation, Policy, PolicyError, make_policy
from agents.trajectory import Step, Trajectory

__all__ = ["Generation", "Policy", "PolicyError", "make_policy", "Step", "Trajectory"]
