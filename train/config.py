"""Typed trainer configuration: the dataclasses below, a YAML file, then ``key=value`` overrides.

The defaults live in one place, the dataclasses below. The YAML files ship with
the package (``configs/``, package data): ``configs/<env>.yaml`` -- the file an
env family's registration names (:mod:`envs.registry`) -- holds the paper's
settings for that family and ``inherit:``s ``configs/base.yaml``, whose
``cpu_demo:`` section holds the overrides the embedded default applies on a
laptop-sized machine (model ``tiny``). Every key is checked against the
dataclasses, so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from nextstate.envs import registry

CONFIG_DIR = Path(str(files("nextstate.configs")))   # the packaged configs/, wherever it is installed


class ConfigError(ValueError):
    """A bad configuration; the message is one line for the user."""


@dataclass
class EnvConfig:
    """Which environment and how it runs."""
    family: str = "terminal"
    tasks: str | None = None          # None: the family's built-in tasks; else a path the env loads
    max_steps: int = 10
    step_timeout: float = 30.0
    sandbox_backend: str = "auto"     # auto | docker | local
    sandbox_disk: str | None = "2g"   # each sandbox's disk limit (a task's own setting wins); null: none
    sandbox_reset: str = "replace"    # replace (a fresh sandbox per episode) | verified (reuse after a verified reset)
    image_pools: str = "shared"       # shared (tasks' own images: pools shared by the run's envs) | per-env
    user: str | None = None           # terminal: run every task as this user (default: the task's)
    tmux: bool = False                # terminal: offer the Terminus-style `tmux` tool
    network: str = "task"             # terminal: task (the network a task's format gives it) | none (no sandbox has it)


@dataclass
class ModelConfig:
    """The policy model (an HF name, a local path, or a preset: ``tiny``, ``tiny-untied``, ``smollm2``)."""
    name: str = "Qwen/Qwen3-8B"
    dtype: str = "auto"               # auto | float32 | bfloat16 | float16


@dataclass
class RolloutConfig:
    """Sampling of episodes: tasks x samples per training step."""
    tasks_per_step: int = 16
    samples_per_task: int = 8
    parallel: int = 8                 # concurrent episodes (sandboxes); --parallel
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_tokens: int = 8192
    max_context_tokens: int = 16384
    max_images: int = 3               # screenshots kept in the prompt's history (OSWorld agents keep 3)
    system_prompt: bool = True        # false: no system turn, no tool list (agents.chat.ChatConfig)


@dataclass
class JudgeConfig:
    """The step judge: ``policy`` (the policy's own model), ``rules`` (:mod:`judges.rules`),
    ``none``, or an OpenAI-compatible URL."""
    mode: str = "policy"              # policy | rules | none | url
    url: str | None = None
    model: str | None = None          # model name at the URL (default: the first /v1/models entry)
    votes: int = 1                    # m
    hints: bool = False               # an LLM judge also asks for a hindsight hint (recorded with its votes)
    temperature: float = 0.6
    max_tokens: int = 1024
    timeout: float = 60.0             # seconds per judge (or LLM hint) request; past it the step gets no votes
    weight: float = 1.0               # c in R_t = o + c * mean(votes)


@dataclass
class AdvantageConfig:
    """Grouping key and what to do with buckets that carry no signal."""
    key: str = "step_index"           # step_index | outcome | state | trajectory
    drop_constant: bool = True        # drop the samples of buckets whose rewards are all equal (else advantage 0)
    eps: float = 1e-6
    shuffle_votes: bool = False       # a control: permute the vote means across a batch's steps


@dataclass
class OPDConfig:
    """On-Policy Distillation from hindsight hints (:mod:`judges.hints`). Per response token
    ``A_t = weight_opd * (log pi_teacher - log pi_old) + weight_rl * A_rl`` on a step with a
    hint, ``weight_rl * A_rl`` on one without. ``mode``: ``rl`` (no hints: today's
    training), ``opd`` (``weight_rl`` taken as 0: only hinted steps train), ``combine``."""
    mode: str = "rl"                  # rl | opd | combine
    weight_opd: float = 1.0
    weight_rl: float = 1.0
    hint_source: str = "judge"        # judge (an LLM: judge.url's server, else the policy) | rules
    teacher: str = "reference"        # reference (the frozen initial model) | policy (the model being trained)


@dataclass
class GroupConfig:
    """The training proxy's group sampling (``python -m train.proxy --samples N``): ``samples``
    candidates per main-line request, ranked together (``ranker``: ``listwise``, the LLM judge
    reading the query and all candidates; ``rules``, a rule baseline; ``auto``: listwise when the
    judge is an LLM), one returned (``choose``: ``best`` or ``random``), all trained with a
    group-normalized advantage of ``reward``: ``rank`` (the ranker's score) or ``quality_gate``
    (``gate * (weight_feedback * score + weight_relevance * relevance + weight_diversity *
    diversity)``, :mod:`train.proxy.group`)."""
    samples: int = 1                  # 1: no group sampling
    ranker: str = "auto"              # auto | listwise | rules
    choose: str = "best"              # best | random
    reward: str = "rank"              # rank | quality_gate
    weight_feedback: float = 0.6
    weight_relevance: float = 0.3
    weight_diversity: float = 0.1


@dataclass
class TrainConfig:
    """Optimizer and loss (veRL's vanilla PPO loss, low_var_kl KL loss)."""
    lr: float = 1e-6                  # constant learning rate, AdamW
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.01
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    micro_batch_size: int = 4         # samples per forward/backward (gradient accumulation)
    updates_per_step: int = 1         # optimizer updates per training step: its samples in as many mini-batches
    pack: bool = True                 # local backend: an episode's steps as one row (train.batch.pack; token-mean only)
    max_staleness: int = 1            # rollouts run this many steps ahead of training (0: no overlap)
    role: str = "agent"               # the steps of this role train the model


@dataclass
class SFTConfig:
    """Supervised warm start before RL (:mod:`train.sft`): oracle runs of ``tasks``, then
    ``steps`` updates of cross-entropy on the successful ones. ``steps: 0`` skips it."""
    tasks: str | None = None          # task source for the oracle runs (e.g. procedural:0:64)
    source: str = "oracle"            # oracle | hasty (see python -m train.sft --source)
    steps: int = 0
    lr: float = 1.0e-3
    batch_size: int = 16


@dataclass
class EvalConfig:
    """Held-out evaluation of a run (either backend): at the start, every ``every`` steps, and at the end."""
    tasks: str | None = None          # None: no held-out evaluation
    every: int = 0                    # 0: at the start and the end only
    samples_per_task: int = 1
    temperature: float = 1.0


@dataclass
class RunConfig:
    """Length, checkpoints and output of a run."""
    steps: int = 200
    save_every: int = 10
    keep_checkpoints: int = 3
    seed: int = 0
    output: str = "runs/{env}"


@dataclass
class VerlConfig:
    """The distributed backend (``--backend verl``); anything else goes in ``overrides``."""
    device: str = "auto"              # auto (cpu when no accelerator is visible and RAY_ADDRESS is unset) | gpu | cpu
    rollout_engine: str = "vllm"      # vllm | sglang (gpu); the cpu device uses the hf rollout
    nnodes: int = 1
    n_gpus_per_node: int = 8
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    micro_batch_size_per_gpu: int = 1
    param_offload: bool = False
    agent_workers: int = 8            # agent-loop worker processes; each runs ceil(parallel / agent_workers) sandboxes
    overrides: list[str] = field(default_factory=list)   # raw Hydra overrides for veRL's config


@dataclass
class Config:
    """The whole trainer configuration.

    ``agents`` trains several policies in one run: ``{roles: model}``, one entry per policy, where
    ``roles`` is a role name or several joined by ``+`` (one policy shared by those roles, trained
    on all their steps). ``{}`` (the default): one policy, ``model.name``, trained on the steps
    of ``train.role``. Each policy has its own optimizer, frozen reference and checkpoint folder.
    """
    agents: dict[str, str] = field(default_factory=dict)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    opd: OPDConfig = field(default_factory=OPDConfig)
    group: GroupConfig = field(default_factory=GroupConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (for printing and saving)."""
        return dataclasses.asdict(self)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as type ``tp`` (strings from the command line are parsed)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
        if origin is dict:
            if isinstance(value, str):   # "a=x,b=y"
                value = dict(item.split("=", 1) for item in value.split(",") if item.strip())
            if not isinstance(value, dict):
                raise ValueError(value)
            return {_coerce(k, args[0], key): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
        if origin is list:
            if isinstance(value, str):
                value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
            return [_coerce(v, args[0], key) for v in value]
    except (TypeError, ValueError, yaml.YAMLError):
        raise ConfigError(f"config key {key}: cannot use {value!r} as {getattr(tp, '__name__', tp)}") from None
    raise ConfigError(f"config key {key}: unsupported type {tp}")


def _apply(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
    """Set the fields of dataclass ``obj`` from nested ``data``; unknown keys are errors."""
    hints = typing.get_type_hints(type(obj))
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in hints:
            known = ", ".join(f.name for f in dataclasses.fields(obj))
            raise ConfigError(f"unknown config key {name!r} (known{' in ' + prefix[:-1] if prefix else ''}: {known})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {name!r} is a section; give {name}.<field>=...")
            _apply(current, value, name + ".")
        else:
            setattr(obj, key, _coerce(value, hints[key], name))


def read_yaml(path: Path) -> dict[str, Any]:
    """A config file with its ``inherit:`` chain resolved (later files win)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    parent = data.pop("inherit", None)
    if parent is None:
        return data
    beside = (path.parent / parent).resolve()   # a file next to this one, else a packaged one
    return merge(read_yaml(beside if beside.exists() or Path(parent).is_absolute() else CONFIG_DIR / parent), data)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of nested dicts; ``over`` wins."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["train.lr=1e-5", "env.max_steps=3"]`` -> nested dict of raw strings."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"bad override {item!r}: expected section.key=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"bad override {item!r}: expected section.key=value")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def judge_overrides(spec: str, flag: str = "--judge") -> list[str]:
    """The ``judge.*`` overrides a command line's judge stands for: ``policy``, ``rules``, ``none``,
    or an OpenAI-compatible URL (``judge.mode=url`` and ``judge.url``); else a :class:`ConfigError`
    that names ``flag``."""
    if spec.startswith(("http://", "https://")):
        return ["judge.mode=url", f"judge.url={spec}"]
    if spec in ("policy", "rules", "none"):
        return [f"judge.mode={spec}"]
    raise ConfigError(f"{flag} must be policy, rules, none or an http(s):// URL, got {spec!r}")


def load_config(env: str, path: str | Path | None = None, overrides: list[str] | None = None,
                cpu_demo: bool = False) -> Config:
    """The configuration of ``env``: file (default the family's registered ``config``, else
    ``configs/base.yaml``), then the file's ``cpu_demo`` section when ``cpu_demo``, then ``overrides``."""
    if env not in registry.names():
        raise ConfigError(f"unknown env {env!r}; choose one of {', '.join(registry.names())}")
    file = Path(path) if path else config_file(env)
    data = read_yaml(file)
    demo = data.pop("cpu_demo", None) or {}
    cfg = Config()
    _apply(cfg, data)
    if cpu_demo:
        _apply(cfg, demo)
    _apply(cfg, parse_overrides(overrides or []))
    cfg.env.family = env
    validate(cfg)
    return cfg


def config_file(env: str) -> Path:
    """The YAML file family ``env`` registered (a bare name is one of the packaged ``configs/``)."""
    name = registry.spec(env).config or "base.yaml"
    return CONFIG_DIR / name if isinstance(name, str) and "/" not in name else Path(name)


def config_from_dict(data: dict[str, Any]) -> Config:
    """A validated :class:`Config` from nested plain data (e.g. ``Config.to_dict()``)."""
    cfg = Config()
    _apply(cfg, data)
    validate(cfg)
    return cfg


def policy_roles(cfg: Config) -> dict[str, tuple[str, ...]]:
    """The policies of a run and the roles each plays: ``{name: roles}`` (name ``"a+b"`` for a
    shared one). Without ``agents``: one policy, shared by every agent of a multi-agent family
    (:class:`~envs.multiagent.MultiAgentEnv`), else named after ``train.role``."""
    if not cfg.agents:
        agents = getattr(registry.spec(cfg.env.family).env_class(), "possible_agents", None)
        if agents:
            return {"+".join(agents): tuple(agents)}
        return {cfg.train.role: (cfg.train.role,)}
    return {name: tuple(name.split("+")) for name in cfg.agents}


def _agents_problem(cfg: Config) -> str | None:
    seen: list[str] = []
    for name, model in cfg.agents.items():
        roles = name.split("+")
        if not all(r.isidentifier() for r in roles):
            return f"agents: {name!r} is not a role name (or roles joined by +)"
        if not model:
            return f"agents: no model for {name!r}"
        seen += roles
    twice = sorted({r for r in seen if seen.count(r) > 1})
    if twice:
        return f"agents: role {twice[0]!r} is given to two policies"
    env_agents = getattr(registry.spec(cfg.env.family).env_class(), "possible_agents", None) if cfg.agents else None
    if env_agents:   # a multi-agent family: its agents, each with a policy
        unknown = [r for r in seen if r not in env_agents]
        if unknown:
            return f"agents: env {cfg.env.family} has no agent {unknown[0]!r} (its agents: {', '.join(env_agents)})"
        missing = [a for a in env_agents if a not in seen]
        if missing:
            return f"agents: no policy plays {missing[0]!r} of env {cfg.env.family} (its agents: {', '.join(env_agents)})"
    return None


def _size_ok(size: str | None) -> bool:
    from nextstate.containers.protocol import parse_size
    try:
        return size is None or parse_size(size) > 0
    except ValueError:
        return False


def _group_checks(g: GroupConfig) -> list[tuple[bool, str]]:
    """The checks of the proxy's group sampling settings (``group.*``)."""
    weights = {"feedback": g.weight_feedback, "relevance": g.weight_relevance, "diversity": g.weight_diversity}
    checks = [(g.samples >= 1, f"group.samples must be at least 1, got {g.samples}"),
              (g.ranker in ("auto", "listwise", "rules"), f"group.ranker must be auto, listwise or rules, got {g.ranker!r}"),
              (g.choose in ("best", "random"), f"group.choose must be best or random, got {g.choose!r}"),
              (g.reward in ("rank", "quality_gate"), f"group.reward must be rank or quality_gate, got {g.reward!r}")]
    checks += [(math.isfinite(w) and w >= 0, f"group.weight_{name} must be a finite number >= 0, got {w!r}")
               for name, w in weights.items()]
    checks.append((g.reward != "quality_gate" or sum(weights.values()) > 0,
                   "the group.weight_* sum to 0: group.reward=quality_gate would reward nothing"))
    return checks


def validate(cfg: Config) -> None:
    """Range checks that need no machine state."""
    checks = [
        (cfg.rollout.parallel >= 1, f"--parallel must be at least 1, got {cfg.rollout.parallel}"),
        (cfg.rollout.tasks_per_step >= 1, "rollout.tasks_per_step must be at least 1"),
        (cfg.rollout.samples_per_task >= 1, "rollout.samples_per_task must be at least 1"),
        (cfg.rollout.max_response_tokens >= 1, "rollout.max_response_tokens must be at least 1"),
        (cfg.env.max_steps >= 1, "env.max_steps must be at least 1"),
        (cfg.run.steps >= 0, "run.steps must be non-negative"),
        (cfg.run.save_every >= 1, "run.save_every must be at least 1"),
        (cfg.train.micro_batch_size >= 1, "train.micro_batch_size must be at least 1"),
        (cfg.train.max_staleness >= 0, "train.max_staleness must be non-negative"),
        (cfg.train.updates_per_step >= 1, "train.updates_per_step must be at least 1"),
        (not cfg.train.pack or cfg.train.loss_agg_mode == "token-mean",
         f"train.pack (on by default) needs train.loss_agg_mode=token-mean, got {cfg.train.loss_agg_mode!r}: "
         "set train.pack=false (a packed row holds several steps)"),
        (cfg.judge.votes >= 1, "judge.votes must be at least 1"),
        (math.isfinite(cfg.judge.timeout) and cfg.judge.timeout > 0,
         f"judge.timeout must be a positive number of seconds, got {cfg.judge.timeout!r}"),
        (cfg.sft.steps >= 0 and cfg.sft.batch_size >= 1, "sft.steps must be >= 0 and sft.batch_size >= 1"),
        (cfg.sft.steps == 0 or bool(cfg.sft.tasks), "sft.steps > 0 needs sft.tasks"),
        (cfg.sft.source in ("oracle", "hasty"), "sft.source must be oracle or hasty"),
        (cfg.eval.every >= 0 and cfg.eval.samples_per_task >= 1, "eval.every must be >= 0, eval.samples_per_task >= 1"),
        (cfg.judge.mode in ("policy", "rules", "none", "url"),
         f"judge.mode must be policy, rules, none or url, got {cfg.judge.mode!r}"),
        (cfg.judge.mode != "url" or bool(cfg.judge.url), "judge.mode=url needs judge.url"),
        (cfg.env.sandbox_backend in ("auto", "docker", "local"), "env.sandbox_backend must be auto, docker or local"),
        (cfg.env.sandbox_reset in ("replace", "verified"), "env.sandbox_reset must be replace or verified"),
        (cfg.env.image_pools in ("shared", "per-env"), "env.image_pools must be shared or per-env"),
        (cfg.env.network in ("task", "none"), "env.network must be task or none"),
        (_size_ok(cfg.env.sandbox_disk), f"env.sandbox_disk must be a size like 2g or 512m, got {cfg.env.sandbox_disk!r}"),
        (cfg.verl.rollout_engine in ("vllm", "sglang"), "verl.rollout_engine must be vllm or sglang"),
        (cfg.verl.device in ("auto", "gpu", "cpu"), "verl.device must be auto, gpu or cpu"),
        (len(cfg.train.betas) == 2, "train.betas needs two numbers"),
        (cfg.opd.mode in ("rl", "opd", "combine"), f"opd.mode must be rl, opd or combine, got {cfg.opd.mode!r}"),
        (cfg.opd.hint_source in ("judge", "rules"), f"opd.hint_source must be judge or rules, got {cfg.opd.hint_source!r}"),
        (cfg.opd.teacher in ("reference", "policy"), f"opd.teacher must be reference or policy, got {cfg.opd.teacher!r}"),
    ]
    for ok, message in checks + _group_checks(cfg.group):
        if not ok:
            raise ConfigError(message)
    problem = _agents_problem(cfg)
    if problem:
        raise ConfigError(problem)
    from nextstate.train.advantage import advantage_keys
    if cfg.advantage.key not in advantage_keys():
        raise ConfigError(f"advantage.key must be one of {', '.join(advantage_keys())}, got {cfg.advantage.key!r}")
