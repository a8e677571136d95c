"""Several policies in one local run (``agents``): each trained on its own role's steps, with its
own checkpoint folder and metrics, restored by ``--resume``; and one policy shared by both roles."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from nextstate.agents.testing import ScriptedPolicy
from nextstate.envs.relay import RelayEnv
from nextstate.train import checkpoint
from nextstate.train.__main__ import build_config, parse_args
from nextstate.train.config import ConfigError, load_config, policy_roles
from nextstate.train.local import LocalTrainer
from nextstate.train.rollout import run_episode

pytestmark = pytest.mark.docker


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def team_episodes(env: RelayEnv, right: bool, group: str, sample: int):
    """A scripted team (the test doubles stand in for models): the reader reads and tells; the
    writer answers the word it was told (``right``) or another one."""
    task = env.tasks[1]
    word = task.data["value"]
    reader = ScriptedPolicy([call("bash", command="cat /app/note"), call("say", message=word)])
    writer = ScriptedPolicy([call("say", message="ready"), call("answer", word=word if right else "nope")])
    with ThreadPoolExecutor(2) as pool:
        return asyncio.run(run_episode(env, {"reader": reader, "writer": writer}, task=task, group_id=group,
                                       sample=sample, executor=pool))


@pytest.fixture(scope="module")
def trajectories(terminal_image):
    env = RelayEnv("relay:0:4")
    try:
        trajs = [team_episodes(env, right, "g", i) for i, right in enumerate([True, False, True, False])]
    finally:
        env.close()
    assert [t.outcome for t in trajs] == [1.0, -1.0, 1.0, -1.0]
    return trajs


def config(tmp_path, agents: list[str]):
    return load_config("relay", overrides=[f"agents.{a}" for a in agents] + [
        "eval.tasks=null", "run.steps=1", f"run.output={tmp_path}", "train.lr=1e-2", "model.dtype=float32",
        "rollout.parallel=1", "judge.mode=none"])


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def test_two_policies_each_train_on_their_own_role_and_resume(tmp_path, trajectories):
    cfg = config(tmp_path, ["reader=tiny", "writer=tiny"])
    trainer = LocalTrainer(cfg, tmp_path, progress=False)
    try:
        assert [(m.name, m.roles) for m in trainer.members] == [("reader", ("reader",)), ("writer", ("writer",))]
        assert trainer.policies() == {"reader": trainer.members[0].policy, "writer": trainer.members[1].policy}
        before = {m.name: weights(m.learner.model) for m in trainer.members}
        metrics = trainer.train(0, trajectories)
        after = {m.name: weights(m.learner.model) for m in trainer.members}
    finally:
        trainer.close()
    for name in ("reader", "writer"):
        assert not torch.equal(before[name], after[name])                      # both changed
        assert metrics[f"{name}/batch/samples"] == 8                            # 2 steps x 4 episodes
    rows = [json.loads(line) for line in (tmp_path / "advantages.jsonl").read_text().splitlines()]
    assert {(r["policy"], r["role"]) for r in rows} == {("reader", "reader"), ("writer", "writer")}
    ckpt = checkpoint.latest(tmp_path)
    assert {p.name for p in ckpt.iterdir()} == {"meta.json", "reader", "writer"}
    assert (ckpt / "writer" / "model" / "model.safetensors").is_file() and (ckpt / "reader" / "state.pt").is_file()
    resumed = LocalTrainer(cfg, tmp_path, resume=True, progress=False)
    try:
        assert resumed.start == 1
        for m in resumed.members:
            assert torch.equal(weights(m.policy.model), after[m.name])          # each role restored
            assert m.learner.optimizer.state_dict()["state"]                    # with its optimizer state
    finally:
        resumed.close()


def test_one_policy_shared_by_both_roles_trains_on_every_step(tmp_path, trajectories):
    cfg = config(tmp_path, ["reader+writer=tiny"])
    assert policy_roles(cfg) == {"reader+writer": ("reader", "writer")}
    trainer = LocalTrainer(cfg, tmp_path, progress=False)
    try:
        metrics = trainer.train(0, trajectories)
    finally:
        trainer.close()
    assert metrics["batch/samples"] == 16 and (checkpoint.latest(tmp_path) / "reader+writer" / "model").is_dir()


def test_agents_flag_and_its_errors():
    cfg, _ = build_config(parse_args(["--env", "relay", "--agents", "reader=tiny,writer=tiny", "--dry-run"]))
    assert cfg.agents == {"reader": "tiny", "writer": "tiny"} and cfg.model.name == "tiny-untied"   # relay's cpu_demo
    cfg, demo = build_config(parse_args(["--env", "relay", "--agents", "reader=tiny-untied,writer=tiny", "--dry-run"]))
    assert demo and cfg.agents == {"reader": "tiny-untied", "writer": "tiny"}
    assert policy_roles(load_config("relay")) == {"reader+writer": ("reader", "writer")}   # no --agents: shared
    for argv, message in [(["--agents", "reader"], "ROLE=MODEL"),
                          (["--agents", "reader=tiny,reader+writer=tiny"], "given to two policies"),
                          (["--agents", "bad role=tiny"], "not a role name")]:
        with pytest.raises(ConfigError, match=message):
            build_config(parse_args(["--env", "relay", *argv, "--dry-run"]))
