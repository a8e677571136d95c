"""The distributed backend on veRL 0.9.1 (``python -m train --backend verl``).

* :mod:`~train.verl_backend.agent_loop` -- the ``nextstate`` agent loop: one
  environment episode per rollout, judged step by step, one output per step;
* :mod:`~train.verl_backend.advantage` -- step rewards and group normalization
  on a veRL ``DataProto`` (the shared :mod:`train.advantage` code);
* :mod:`~train.verl_backend.trainer` -- the ``nextstate`` trainer mode: veRL's
  synchronous PPO trainer with that advantage computation;
* :mod:`~train.verl_backend.policies` -- the veRL parts of a second and later
  trained policy (``--agents``): worker group, rollout servers, weight sync;
* :mod:`~train.verl_backend.plugin` -- what the ``verl.plugins`` entry point
  imports to register both;
* :mod:`~train.verl_backend.launch` -- Hydra config, task data, Ray launch.
"""

RUN_ENV = "NEXTSTATE_RUN_ID"   # the run id the launcher hands its workers: it labels the run's sandboxes
POLICY_ENV = "NEXTSTATE_POLICY"  # in the actor workers of a run's second and later policies: the policy's name
