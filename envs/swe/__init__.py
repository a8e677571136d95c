"""The SWE family: a repository at a commit, graded by swebench's harness in a fresh container.

:mod:`~envs.swe.env` is the env and :mod:`~envs.swe.editor` the editor tool it uploads;
:mod:`~envs.swe.instances` reads SWE-bench rows, :mod:`~envs.swe.specs` holds the per-repository
install specs, :mod:`~envs.swe.grading` grades a patch, and :mod:`~envs.swe.images` builds
instance images (``python -m containers build-swe``). ``tasks/`` holds the offline instances.
The env module's names are importable from here, loaded on first use.
"""

from nextstate.envs import registry

registry.register(
    "swe", "nextstate.envs.swe.env:SWEEnv", id="nextstate/SWE-v0", config="swe.yaml", judge_template="swe.yaml",
    validator="nextstate.envs.swe.env:check_swe",
    intro="You are a software engineer fixing an issue in a code repository. Explore the code, "
          "reproduce the problem, edit the files and check your fix by running tests, one tool "
          "call per answer.")


__getattr__ = registry.lazy_names("nextstate.envs.swe.env")
