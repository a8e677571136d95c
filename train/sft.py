"""``python -m train.sft``: supervised fine-tuning on successful trajectories (a warm start for RL).

Rejection-sampling fine-tuning: keep the episodes that succeeded, and train the
model with cross-entropy on the actions they took, each given the exact prompt
the agent loop builds at that step (same system prompt, chat template, tool
schemas and history). The episodes come from

* ``rollouts.jsonl`` files written by ``python -m train`` (``--rollouts``):
  the steps of trajectories whose outcome is above ``--min-outcome``; or
* oracle runs (``--tasks``): every task's reference actions played in a real
  sandbox, kept when the task's check passes; or, with ``--source hasty``
  (procedural tasks), a behaviour policy that reads the note and writes its word
  half of the time and otherwise writes a word drawn at random without reading,
  kept pass or fail: a warm start that knows the format and the mapping but
  reads only half of the time (held-out success about 5/8 with 4 words).

On a multi-agent family (:class:`~envs.multiagent.MultiAgentEnv`, e.g. ``relay``) every
example is one agent's step given that agent's own view, as the agent loop shows it, and
``--roles`` picks whose steps train the model: one model per role (``--roles reader``), or one
shared by several (``--roles reader+writer``, the default: every role).

It works with any local model (a preset: ``--model tiny``, ``--model smollm2``; a directory, a
hub name) and writes a model directory that ``python -m train --model DIR`` loads::

    python -m train.sft --env terminal --tasks procedural:0:64 --steps 150 --output runs/sft
    python -m train.sft --env terminal --rollouts runs/terminal/rollouts.jsonl --output runs/sft2

``python -m train`` runs it by itself before RL when the config's ``sft``
section has ``steps > 0`` (the CPU demos do), into ``<output>/warm_start``; with
``agents``, one per policy into ``<output>/warm_start/<name>``, each from that policy's model
and on the steps of its own roles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from nextstate.agents.chat import ChatConfig, action_text
from nextstate.envs import env_class, registry

log = logging.getLogger(__name__)


@dataclass
class Example:
    """One step to imitate: the chat messages before it, the action text the agent wrote, the
    role that wrote it, and the tools its prompt renders (as the agent loop passed them)."""

    messages: list[dict]
    text: str
    role: str = "agent"
    tools: list[dict] | None = None
    action: dict | None = None       # the call played (what a judge reads)
    next_state: dict | None = None   # what the environment answered (what a judge or hint reads)


def examples_from_rollouts(paths: Iterable[str | Path], min_outcome: float = 0.0,
                           roles: Iterable[str] = ("agent",)) -> list[Example]:
    """The steps of ``roles`` in every trajectory in ``paths`` whose outcome is above ``min_outcome``."""
    roles = set(roles)
    examples: list[Example] = []
    for path in paths:
        steps: dict[tuple, list[tuple[int, Example]]] = {}
        good: list[tuple] = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            key = (row.get("group_id"), row.get("sample"))
            if row.get("kind") == "step" and row.get("role", "agent") in roles:
                steps.setdefault(key, []).append((row["step"], Example(row["messages"], row["text"],
                                                                       row.get("role", "agent"))))
            elif row.get("kind") == "trajectory" and row.get("status") != "aborted" \
                    and (row.get("outcome") or 0.0) > min_outcome:
                good.append(key)
        for key in good:
            examples += [ex for _, ex in sorted(steps.get(key, []), key=lambda p: p[0])]
    return examples


SOURCES = ("oracle", "hasty")


def hasty_plan(task: Any, rng: random.Random) -> list[dict]:
    """The hasty behaviour policy's actions on ``task``: procedural and outdir tasks
    (:func:`envs.terminal.procedural.hasty_actions`, :func:`envs.terminal.outdir.hasty_actions`)
    and relay (:func:`envs.relay.env.hasty_actions`, in turn order)."""
    from nextstate.envs.relay import env as relay
    from nextstate.envs.terminal import outdir, procedural

    if task.category == relay.CATEGORY:
        return relay.hasty_actions(task, rng)
    if not task.data.get("choices"):
        raise ValueError(f"sft source hasty needs procedural or relay tasks; {task.id} has no choices")
    behaviour = outdir.hasty_actions if task.data.get("behaviour") == "outdir" else procedural.hasty_actions
    return behaviour(task, rng)


def oracle_episode(env: Any, task: Any, policy: Any, chat: ChatConfig, source: str = "oracle",
                   rng: random.Random | None = None, plan: list[dict] | None = None) -> list[Example]:
    """Play ``task``'s reference actions on ``env``; its steps when the check passed, else [].

    Each step's prompt is the one the agent loop builds (:func:`train.rollout.role_prompt`): on a
    :class:`~envs.multiagent.MultiAgentEnv` the acting agent's own view (its briefing, its turns,
    what reached its inbox), and the example names that agent as its role.
    ``source="hasty"`` plays a behaviour policy instead that looks half of the time
    (:func:`hasty_plan`); its valid steps are kept whether the check passed or not, so a model
    trained on them learns the format and the mapping but not to always look first. ``plan``, given,
    is played instead of either, its steps kept pass or fail."""
    from nextstate.envs.multiagent import MultiAgentEnv
    from nextstate.train.rollout import Histories, role_prompt

    keep_all = source == "hasty" or plan is not None
    if plan is None:
        plan = hasty_plan(task, rng or random.Random(0)) if source == "hasty" else env.oracle_actions(task, "gold")
    first_obs, _ = env.reset(options={"task": task})
    histories = Histories.start(env, env.present(first_obs))
    out: list[Example] = []
    reward = -1.0
    for action in plan:
        role = env.agent_selection if isinstance(env, MultiAgentEnv) else "agent"
        messages, tools = role_prompt(env, role, histories, policy, chat)
        text = action_text(action)
        obs, reward, terminated, truncated, info = env.step(text)
        if "aborted" in info or not info["next_state"].get("valid", True):
            return []
        out.append(Example(messages, text, role, tools, action, info["next_state"]))
        histories.record(role, text, env.present(obs), True, info.get("next_agent", role))
        if terminated or truncated:
            break
    return out if reward > 0 or keep_all else []


def oracle_runs(env_factory: Callable[[], Any], tasks: list[Any], policy: Any, chat: ChatConfig,
                parallel: int = 4, source: str = "oracle", seed: int = 0,
                plan_of: Callable[[Any], list[dict]] | None = None) -> list[list[Example]]:
    """One :func:`oracle_episode` per task (its steps, or [] when it failed and is not kept),
    ``parallel`` sandboxes at once (sandbox k plays tasks k, k + parallel, ...; the result lists
    sandbox 0's episodes first); ``plan_of(task)``, given, names the actions to play."""
    envs = [env_factory() for _ in range(max(1, min(parallel, len(tasks))))]

    def play(env: Any, task: Any) -> list[Example]:
        return oracle_episode(env, task, policy, chat, source, random.Random(f"{seed}-{task.id}"),
                              plan_of(task) if plan_of else None)
    try:
        with ThreadPoolExecutor(len(envs)) as pool:
            chunks = [tasks[i::len(envs)] for i in range(len(envs))]
            runs = pool.map(lambda pair: [play(pair[0], t) for t in pair[1]], zip(envs, chunks))
            return [ep for eps in runs for ep in eps]
    finally:
        for env in envs:
            env.close()


def oracle_examples(env_factory: Callable[[], Any], tasks: list[Any], policy: Any, chat: ChatConfig,
                    parallel: int = 4, source: str = "oracle", seed: int = 0) -> list[Example]:
    """The steps of the successful oracle runs of ``tasks`` (or of the behaviour policy that
    ``source`` names, see :func:`oracle_episode`), ``parallel`` sandboxes at once."""
    episodes = oracle_runs(env_factory, tasks, policy, chat, parallel, source, seed)
    if sum(not ep for ep in episodes):
        log.warning("%d of %d oracle runs failed and are left out",
                    sum(not ep for ep in episodes), len(episodes))
    return [ex for ep in episodes for ex in ep]


def fine_tune(policy: Any, examples: list[Example], *, steps: int, lr: float,
              batch_size: int, seed: int = 0, progress: bool = True) -> list[float]:
    """``steps`` AdamW updates of token-mean cross-entropy on the examples' responses (in place
    on ``policy.model``); returns the loss of every step."""
    import torch
    from tqdm.auto import tqdm

    from nextstate.train.batch import Sample, collate
    from nextstate.train.loss import token_log_probs

    if not examples:
        raise ValueError("no successful trajectories to fine-tune on")
    tok = policy.tokenizer
    samples = [Sample(policy.prompt_ids(ex.messages, ex.tools),
                      tok.encode(ex.text, add_special_tokens=False),
                      [], 0.0, 0.0) for ex in examples]
    samples = [s for s in samples if s.response_ids]
    for s in samples:
        s.old_log_probs = [0.0] * len(s.response_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    model = policy.model
    model.train()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses: list[float] = []
    order: list[int] = []
    bar = tqdm(range(steps), desc="sft", disable=not progress)
    for _ in bar:
        if len(order) < batch_size:
            extra = list(range(len(samples)))
            rng.shuffle(extra)
            order += extra
        picked, order = order[:batch_size], order[batch_size:]
        mb = collate([samples[i] for i in picked], pad).to(next(model.parameters()).device)
        log_probs, _ = token_log_probs(model, mb, 1.0)
        mask = mb.response_mask.float()
        loss = -(log_probs * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def save(policy: Any, output: Path, meta: dict[str, Any]) -> Path:
    """The fine-tuned model as an HF directory (weights, tokenizer, ``sft.json``)."""
    output.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(output)
    policy.tokenizer.save_pretrained(output)
    (output / "sft.json").write_text(json.dumps(meta, indent=1) + "\n")
    return output


def run(*, env: str, model: str, output: Path, tasks: str | None = None, rollouts: list[str] | None = None,
        steps: int = 150, lr: float = 1e-3, batch_size: int = 16, seed: int = 0, parallel: int = 4,
        max_steps: int | None = None, chat: ChatConfig | None = None, min_outcome: float = 0.0,
        source: str = "oracle", roles: tuple[str, ...] | None = None, progress: bool = True) -> dict[str, Any]:
    """Collect the examples of ``roles`` (default: every agent of the family), fine-tune ``model``
    on them, save it to ``output``; returns the run's summary."""
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.envs.multiagent import MultiAgentEnv

    chat = chat or ChatConfig()
    cls = env_class(env)
    multi = issubclass(cls, MultiAgentEnv)
    family_roles = tuple(cls.possible_agents) if multi else ("agent",)
    roles = roles or family_roles
    if unknown := sorted(set(roles) - set(family_roles)):
        raise ValueError(f"{env} has no role {unknown[0]!r} (its roles: {', '.join(family_roles)})")
    policy = HFPolicy(model, seed=seed)
    try:
        examples: list[Example] = []
        if rollouts:   # a recorded prompt with a system turn rendered its role's tools, if the policy could
            for ex in examples_from_rollouts(rollouts, min_outcome, roles):
                system = bool(ex.messages) and ex.messages[0].get("role") == "system"
                ex.tools = (cls.agent_tools[ex.role] if multi else cls.tools) if system and policy.renders_tools else None
                examples.append(ex)
        if tasks:
            pool = cls.make_pool(parallel)
            try:
                task_list = list(cls(tasks=tasks).tasks)
                examples += [ex for ex in oracle_examples(lambda: cls(tasks=tasks, pool=pool, max_steps=max_steps),
                                                          task_list, policy, chat, parallel, source, seed)
                             if ex.role in roles]
            finally:
                pool.close()
        losses = fine_tune(policy, examples, steps=steps, lr=lr, batch_size=batch_size,
                           seed=seed, progress=progress)
        summary = {"model": model, "env": env, "tasks": tasks, "source": source, "rollouts": rollouts,
                   "roles": list(roles), "examples": len(examples),
                   "steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed,
                   "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}
        save(policy, output, summary)
        return summary
    finally:
        import asyncio
        asyncio.run(policy.aclose())


def warm_start(cfg: Any, output: Path, progress: bool = True, *, model: str | None = None,
               roles: tuple[str, ...] | None = None) -> Path:
    """The warm start a run's ``sft`` section asks for, at ``output`` (reused when it was
    made with the same settings): ``model`` (default ``model.name``) fine-tuned on the steps
    of ``roles`` (default: every agent of the family)."""
    from nextstate.train.wiring import chat_config

    model = model or cfg.model.name
    recipe = {"model": model, "tasks": cfg.sft.tasks, "source": cfg.sft.source, "steps": cfg.sft.steps, "lr": cfg.sft.lr,
              "batch_size": cfg.sft.batch_size, "seed": cfg.run.seed, "max_steps": cfg.env.max_steps,
              "context": cfg.rollout.max_context_tokens, "response": cfg.rollout.max_response_tokens,
              "system_prompt": cfg.rollout.system_prompt, **({"roles": list(roles)} if roles else {})}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    done = output / "sft.json"
    if done.is_file() and json.loads(done.read_text()).get("recipe") == key:
        return output
    summary = run(env=cfg.env.family, model=model, output=output, tasks=cfg.sft.tasks,
                  steps=cfg.sft.steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size, seed=cfg.run.seed,
                  parallel=cfg.rollout.parallel, max_steps=cfg.env.max_steps, source=cfg.sft.source,
                  roles=roles, chat=chat_config(cfg), progress=progress)
    done.write_text(json.dumps({**summary, "recipe": key}, indent=1) + "\n")
    return output


def warm_starts(cfg: Any, output: Path, progress: bool = True) -> dict[str, str]:
    """The model each policy of a run starts from (:func:`~train.config.policy_roles`): without
    ``agents``, one warm start at ``output``; with them, one per policy at ``output/<name>``,
    fine-tuned from that policy's model on the steps of its own roles."""
    from nextstate.train.config import policy_roles

    if not cfg.agents:
        start = str(warm_start(cfg, output, progress))
        return {name: start for name in policy_roles(cfg)}
    return {name: str(warm_start(cfg, output / name, progress, model=cfg.agents[name], roles=roles))
            for name, roles in policy_roles(cfg).items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.sft", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="terminal", help="environment family (its tools shape the prompt); "
                   "MODULE:NAME or NAME imports a family of your own, as in python -m train")
    p.add_argument("--model", default="tiny", help="HF hub name, local model directory, or a preset (tiny, smollm2, ...)")
    p.add_argument("--tasks", help="task source for oracle runs (e.g. procedural:0:64, a task directory)")
    p.add_argument("--source", default="oracle", choices=SOURCES,
                   help="what plays --tasks: the reference solution (kept when it passes), or hasty "
                        "(procedural and relay tasks: look half of the time, else guess; kept pass or fail)")
    p.add_argument("--roles", metavar="ROLE[+ROLE...]",
                   help="train on the steps of these roles only (a multi-agent family: one model per role, "
                        "or one shared by ROLE+ROLE; default: every role)")
    p.add_argument("--rollouts", nargs="*", default=[], help="rollouts.jsonl files of earlier runs")
    p.add_argument("--min-outcome", type=float, default=0.0, help="keep trajectories with an outcome above this")
    p.add_argument("--steps", type=int, default=150, help="optimizer updates")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", type=int, default=4, help="sandboxes for the oracle runs")
    p.add_argument("--max-steps", type=int, help="env steps per oracle episode")
    p.add_argument("--no-system-prompt", action="store_true",
                   help="prompts without the system turn and tool list (as rollout.system_prompt=false)")
    p.add_argument("--output", required=True, help="directory for the fine-tuned model")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.tasks and not args.rollouts:
        print("error: give --tasks (oracle runs) and/or --rollouts FILE...", file=sys.stderr)
        return 2
    if args.steps < 1 or args.batch_size < 1:
        print("error: --steps and --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        summary = run(env=registry.resolve(args.env), model=args.model, output=Path(args.output), tasks=args.tasks,
                      rollouts=args.rollouts, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                      seed=args.seed, parallel=args.parallel, max_steps=args.max_steps,
                      min_outcome=args.min_outcome, source=args.source,
                      roles=tuple(args.roles.split("+")) if args.roles else None,
                      chat=ChatConfig(system_prompt=not args.no_system_prompt))
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
