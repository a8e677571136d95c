"""A new env family is one subclass plus one registration; everything else reads the registry."""

import gymnasium
import pytest

from nextstate.agents.chat import system_prompt
from nextstate.envs import registry
from nextstate.envs.actions import tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.envs.validate import check_oracles, validator
from nextstate.judges.prm import load_template
from nextstate.train.config import load_config


class GuessEnv(NextStateEnv):
    """Guess the number the instruction names; one tool, no sandbox needed."""

    family = "guess"
    default_max_steps = 2
    lease_at_reset = False
    tools = [tool_schema("submit", "Submit your guess; ends the episode.", {"n": "integer"})]

    def load_tasks(self, source):
        return [Task(f"guess-{n}", f"Submit the number {n}.", {"n": n}) for n in (1, 2)]

    def start_episode(self, task):
        self.answer = None
        return "Call submit with the number."

    def call_tool(self, call):
        self.answer = call.arguments["n"]
        return ToolResult("Submitted.", done=True)

    def compute_outcome(self):
        return Outcome(1.0 if self.answer == self.task.data["n"] else -1.0, {"answer": self.answer})

    def oracle_actions(self, task, kind):
        return [{"name": "submit", "arguments": {"n": task.data["n"] if kind == "gold" else -1}}]


@pytest.fixture
def guess(monkeypatch):
    """``guess`` registered for one test, then gone (other tests list the built-in families)."""
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    record = registry.register("guess", GuessEnv, intro="You guess numbers.")
    yield record
    del gymnasium.envs.registry[record.id]


def test_the_built_in_families_are_registered_in_one_place():
    assert registry.names()[:5] == ["terminal", "toolcall", "swe", "gui", "relay"]   # (tests may add more)
    from nextstate.envs.terminal import TerminalEnv
    assert registry.spec("terminal").env_class() is TerminalEnv
    assert gymnasium.spec("nextstate/Terminal-v0").entry_point == "nextstate.envs.terminal.env:TerminalEnv"
    assert "Linux terminal" in system_prompt("terminal", [])
    with pytest.raises(ValueError, match="unknown env 'nope'; known: terminal, toolcall, swe, gui"):
        registry.spec("nope")


def test_a_new_family_gets_every_default_from_its_registration(guess):
    assert gymnasium.spec("nextstate/Guess-v0").entry_point is GuessEnv
    assert system_prompt("guess", []).startswith("You guess numbers.")
    template = load_template("guess")   # the documented default template
    assert template == load_template("guess", "judges/templates/default.yaml")
    assert "{next_state}" in template["user"] and template["limits"]["keep_last"] == 6
    assert validator("guess") == (GuessEnv, check_oracles)
    cfg = load_config("guess", cpu_demo=True)
    assert cfg.env.family == "guess" and cfg.model.name == "tiny"   # base.yaml's cpu_demo
    env = gymnasium.make("nextstate/Guess-v0").unwrapped
    assert check_oracles(env, env.tasks[0]) is None
    env.close()


def test_the_trainer_imports_the_module_of_module_colon_family(guess, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_guess_envs.py").write_text(
        f"from envs import registry\nfrom {__name__} import GuessEnv\n"
        "registry.register('guess', GuessEnv, intro='Imported.')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from nextstate.train.__main__ import main
    assert main(["--env", "my_guess_envs:guess", "--model", "tiny", "--dry-run"]) == 0
    assert "family: guess" in capsys.readouterr().out
    assert registry.spec("guess").intro == "Imported."
    assert main(["--env", "no_such_module:guess", "--dry-run"]) == 2
    assert "error: cannot import 'no_such_module' for env 'guess'" in capsys.readouterr().err


def test_a_bare_name_that_is_not_registered_imports_the_module_of_that_name(tmp_path, monkeypatch, capsys):
    """``python -m envs validate count`` finds the family a ``count.py`` registers."""
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    (tmp_path / "guess_by_name.py").write_text(
        f"from envs import registry\nfrom {__name__} import GuessEnv\n"
        "registry.register('guess_by_name', GuessEnv, id='nextstate/GuessByName-v0')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert registry.resolve("guess_by_name") == "guess_by_name"
        assert registry.spec("guess_by_name").env_class() is GuessEnv
    finally:
        gymnasium.envs.registry.pop("nextstate/GuessByName-v0", None)
    from nextstate.envs.__main__ import main
    assert main(["validate", "no_such_family"]) == 1
    assert "no validator for 'no_such_family'" in capsys.readouterr().err


def test_one_training_step_on_a_newly_registered_family(guess, tmp_path):
    """The local backend with the tiny model: rollouts, the policy-as-judge on the default
    template, one update and a checkpoint."""
    from nextstate.train.local import LocalTrainer

    cfg = load_config("guess", cpu_demo=True, overrides=[
        "run.steps=1", "run.save_every=1", "env.sandbox_backend=local", "rollout.tasks_per_step=1",
        "rollout.parallel=2", "rollout.max_response_tokens=24", "env.max_steps=1"])
    rows = LocalTrainer(cfg, tmp_path, progress=False).run()
    assert [r["step"] for r in rows] == [1] and rows[0]["episodes"] == 2
    judged = (tmp_path / "rollouts.jsonl").read_text()
    assert "You review single steps of an AI agent that calls tools" in judged   # default template
    assert (tmp_path / "checkpoints").is_dir()
