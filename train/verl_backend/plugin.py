"""What veRL's ``verl.plugins`` entry point loads: importing it registers

* the ``cpu`` platform and veRL's FSDP engines for it
  (:mod:`train.verl_backend.cpu`), first, before anything asks veRL for its
  platform;
* the ``hf`` rollout (:mod:`train.verl_backend.hf_rollout`): a transformers
  model behind veRL's rollout server interfaces, for machines without vLLM;
* the ``nextstate`` agent loop (:mod:`train.verl_backend.agent_loop`), and
* the ``nextstate`` trainer mode (:mod:`train.verl_backend.trainer`), which
  needs veRL's TransferQueue trainer stack (``transfer_queue``); without it
  only the agent loop is registered.

veRL imports every ``verl.plugins`` entry point at ``import verl`` (in the
driver and in each Ray worker); ``launch`` also names this module in
``VERL_USE_EXTERNAL_MODULES`` for runs from a source checkout.
"""

import importlib.util

from nextstate.train.verl_backend import cpu  # noqa: F401  (first: the platform, before anything asks veRL for one)
from nextstate.train.verl_backend import agent_loop, hf_rollout  # noqa: F401  (the agent loop and the hf rollout)

if importlib.util.find_spec("transfer_queue") is not None:
    from nextstate.train.verl_backend import trainer  # noqa: F401  (registers the trainer mode)
