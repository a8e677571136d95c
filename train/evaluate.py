"""``python -m train.evaluate``: run a policy (or an oracle) on every task of a family and score it.

    python -m train.evaluate --env swe --tasks builtin --policy gold --output runs/eval-gold
    python -m train.evaluate --env swe --tasks instances.jsonl --policy http://vllm:8000 --parallel 8 --output runs/eval
    python -m train.evaluate --env terminal --policy noop --output runs/eval-noop

``--policy`` is a model (a preset such as ``tiny`` or ``smollm2``, a local path or hub name, or an
OpenAI-compatible URL, run through :mod:`train.rollout`), ``gold`` (the task's
reference solution, no model) or ``noop`` (finish at once), both played from
the env's ``oracle_actions(task, kind)``. Tasks the env cannot run here (its
``skip_reason``, or ``TaskUnsupported`` at reset: an OSWorld task needing an
app the desktop lacks) are listed as skipped with the reason and left out of
the rates.

Writes to ``--output``: ``results.jsonl`` (one line per task: success, reward,
status, steps, tokens, time, failure reason), ``report.json`` (success rate,
mean outcome, per-category breakdown, ``infrastructure``: failures that were the machinery's, by
class, also on the summary line) and, for SWE, ``predictions.jsonl`` in
SWE-bench's format (``instance_id``, ``model_name_or_path``, ``model_patch``),
which swebench's harness reads; for a model policy, ``rollouts.jsonl`` (every step's prompt,
action and next state, as training writes it; images as PNG files in ``images/``).
Prints one summary line. Ctrl-C stops it as it stops training: one line, exit code 130, no
sandbox left.

A model policy's requests are bounded by ``--max-response-tokens`` (per action), and a URL policy's by
``--request-timeout`` and ``--retries``. A request the client gives up on (its timeout) has its
connection closed, which is how vLLM and SGLang learn to abort it, before any retry is sent.
"""

from __future__ import annotations

import sys

from nextstate.train.interrupt import INTERRUPT
if __name__ == "__main__":   # before the slow imports below
    INTERRUPT.install()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from tqdm import tqdm  # noqa: E402

from nextstate.agents.chat import ChatConfig  # noqa: E402
from nextstate.envs import env_class, registry  # noqa: E402
from nextstate.envs.base import NextStateEnv, Task, TaskUnsupported  # noqa: E402
from nextstate.envs.pool import EnvCache  # noqa: E402
from nextstate.envs.validate import infrastructure  # noqa: E402

ORACLE_KINDS = ("gold", "noop")
#: Exceptions that mean the run's configuration is wrong (a missing image, a bad row), not an episode.
CONFIG_ERRORS = ("InstanceError", "SpecError", "ImageNotFound")


def _outcome_row(task: Task, outcome: dict[str, Any] | None, status: str, error: str | None,
                 steps: int, tokens: int, seconds: float) -> dict[str, Any]:
    """One line of results.jsonl."""
    outcome = dict(outcome or {})
    reward = outcome.get("reward")
    reason = error or outcome.get("reason")
    if reason is None and outcome.get("resolved") is False:
        reason = "not resolved"
    return {"task_id": task.id, "category": task.category, "success": reward is not None and reward >= 1,
            "reward": reward, "status": status, "steps": steps, "tokens": tokens,
            "time": round(seconds, 3), "reason": reason, "outcome": outcome}


def run_oracle(env_factory: Callable[[], NextStateEnv], tasks: list[Task], kind: str,
               parallel: int) -> list[dict[str, Any]]:
    """Plays oracle ``kind`` on every task, ``parallel`` envs at once (one per thread). When the
    caller is interrupted (Ctrl-C), the episodes under way end after their current step, before
    the envs close, so none starts a sandbox after the clean-up."""
    envs = EnvCache(env_factory)
    stop = threading.Event()

    def one(task: Task) -> dict[str, Any]:
        start, steps, info, terminated = time.monotonic(), 0, {}, False
        env = None
        try:
            env = envs.take()
            env.reset(options={"task": task})
            for action in env.oracle_actions(task, kind):
                if stop.is_set():
                    break
                _, _, terminated, truncated, info = env.step(action)
                steps += 1
                if terminated or truncated:
                    break
        except TaskUnsupported as e:
            return _outcome_row(task, None, "skipped", e.reason, steps, 0, time.monotonic() - start)
        except Exception as e:  # a broken task must not stop the others
            return _outcome_row(task, None, "aborted", f"{type(e).__name__}: {e}", steps, 0,
                                time.monotonic() - start)
        finally:
            if env is not None:
                envs.give_back(env)
        if "aborted" in info:
            status, error = "aborted", str(info["aborted"])
        elif "outcome" not in info:
            status, error = "aborted", f"the {kind} actions did not end the episode"
        else:
            status, error = ("finished" if terminated else "truncated"), None
        return _outcome_row(task, info.get("outcome"), status, error, steps, 0, time.monotonic() - start)

    rows = []
    ex = ThreadPoolExecutor(parallel)
    try:
        with tqdm(total=len(tasks), desc=kind, unit="task") as bar:
            for fut in as_completed([ex.submit(one, t) for t in tasks]):
                rows.append(fut.result())
                bar.update()
    finally:
        stop.set()
        ex.shutdown(wait=True, cancel_futures=True)   # queued tasks never start
        envs.close()
    return rows


def run_policy(env_factory: Callable[[], NextStateEnv], tasks: list[Task], policy: Any,
               parallel: int, rollouts: Path | None = None, *, chat: ChatConfig | None = None,
               sampling: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Plays ``policy`` (a :class:`~agents.policy.Policy`) on every task through :mod:`train.rollout`,
    with the prompt shape ``chat`` and the ``sampling`` parameters (temperature, top_p) a trainer
    uses; with ``rollouts``, logs every step there as training does (screenshots as PNG files beside it)."""
    from nextstate.agents.recorder import Recorder
    from nextstate.train.rollout import collect

    recorder = Recorder(rollouts) if rollouts else None
    try:
        trajectories = asyncio.run(collect(env_factory, policy, tasks, parallel=parallel,
                                           recorder=recorder, chat=chat, sampling=sampling))
    finally:
        if recorder:
            recorder.close()
    by_id = {t.id: t for t in tasks}
    rows = []
    for traj in trajectories:
        seconds = sum(s.timing.get("generate", 0.0) + s.timing.get("env", 0.0) for s in traj.steps)
        tokens = sum(len(s.response_ids) for s in traj.steps)
        rows.append(_outcome_row(by_id[traj.task_id], traj.info.get("outcome"), traj.status,
                                 traj.error, len(traj.steps), tokens, seconds))
    return rows


def summarize(rows: list[dict[str, Any]], *, family: str, tasks: str, policy: str,
              elapsed: float) -> dict[str, Any]:
    """report.json: success rate, mean outcome, and both per category; failures that were the
    infrastructure's, by class (:func:`envs.validate.infrastructure`)."""
    def stats(group: list[dict[str, Any]]) -> dict[str, Any]:
        rewards = [r["reward"] for r in group if r["reward"] is not None]
        succeeded = sum(r["success"] for r in group)
        return {"total": len(group), "succeeded": succeeded,
                "success_rate": succeeded / len(group) if group else 0.0,
                "mean_outcome": sum(rewards) / len(rewards) if rewards else None,
                "aborted": sum(r["status"] == "aborted" for r in group)}

    aborted = [r.get("reason") or "unknown" for r in rows if r["status"] == "aborted"]
    infra = Counter(infrastructure(str(r["reason"])) for r in rows
                    if not r["success"] and r["status"] != "skipped" and r.get("reason"))
    infra.pop(None, None)

    skipped = {r["task_id"]: r["reason"] for r in rows if r["status"] == "skipped"}
    rows = [r for r in rows if r["status"] != "skipped"]
    categories = sorted({r["category"] for r in rows})
    report = {"env": family, "tasks": tasks, "policy": policy, **stats(rows),
              "by_category": {c: stats([r for r in rows if r["category"] == c]) for c in categories},
              "skipped": len(skipped), "skipped_reasons": skipped, "elapsed": round(elapsed, 1),
              "abort_reasons": {reason: aborted.count(reason) for reason in dict.fromkeys(aborted)},
              "infrastructure": dict(sorted(infra.items()))}
    if family == "swe":
        report["resolve_rate"] = report["success_rate"]
        report["resolved_ids"] = sorted(r["task_id"] for r in rows if r["success"])
        report["unresolved_ids"] = sorted(r["task_id"] for r in rows
                                          if not r["success"] and r["status"] != "aborted")
        report["error_ids"] = sorted(r["task_id"] for r in rows if r["status"] == "aborted")
    return report


def evaluate(family: str, tasks: Any = "builtin", policy: Any = "gold", *, parallel: int = 4,
             output: str | Path, max_steps: int | None = None, model: str | None = None,
             ids: list[str] | None = None, backend: str = "auto",
             env_kwargs: dict[str, Any] | None = None, chat: ChatConfig | None = None,
             sampling: dict[str, Any] | None = None, policy_kwargs: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """Runs the evaluation and writes its files; returns the report.

    ``policy``: ``"gold"``, ``"noop"``, a :func:`~agents.make_policy` string
    (made with ``policy_kwargs``: a URL policy's ``timeout``, ``max_retries``) or a
    :class:`~agents.policy.Policy`. ``ids`` restricts the run to these task ids.
    ``chat`` and ``sampling``: a model policy's prompt shape and sampling (see :func:`run_policy`).
    """
    env_cls = env_class(family)
    kw = {"backend": backend, **(env_kwargs or {})}
    probe = env_cls(None if tasks in (None, "builtin") else tasks, **kw)
    loaded = probe.tasks
    if ids:
        unknown = sorted(set(ids) - {t.id for t in loaded})
        if unknown:
            raise ValueError(f"unknown task ids: {', '.join(unknown)}")
        loaded = [t for t in loaded if t.id in set(ids)]
    skipped = [_outcome_row(t, None, "skipped", probe.skip_reason(t), 0, 0, 0.0)
               for t in loaded if probe.skip_reason(t)]
    probe.close()
    everything, loaded = loaded, [t for t in loaded if t.id not in {r["task_id"] for r in skipped}]
    parallel = max(1, min(parallel, len(loaded) or 1))
    pool = env_cls.shared_pool(loaded, parallel, backend=backend)
    policy_name = policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)

    def factory() -> NextStateEnv:
        return env_cls(loaded, pool=pool, max_steps=max_steps, **kw)

    start = time.monotonic()
    try:
        if not loaded:
            rows = []
        elif isinstance(policy, str) and policy in ORACLE_KINDS:
            rows = run_oracle(factory, loaded, policy, parallel)
        else:
            if isinstance(policy, str):
                from nextstate.agents import make_policy
                policy = make_policy(policy, **({"model": model} if model else {}), **(policy_kwargs or {}))
            rows = run_policy(factory, loaded, policy, parallel, Path(output) / "rollouts.jsonl",
                              chat=chat, sampling=sampling)
    finally:
        if pool is not None:
            pool.close()
    order = {t.id: i for i, t in enumerate(everything)}
    rows = sorted(rows + skipped, key=lambda r: order[r["task_id"]])
    report = summarize(rows, family=family, tasks=str(tasks), policy=policy_name,
                       elapsed=time.monotonic() - start)
    write_outputs(Path(output), rows, report, family=family, model_name=model_name(policy, policy_name))
    return report


def model_name(policy: Any, policy_name: str) -> str:
    """SWE-bench's ``model_name_or_path``: the served model's name, the local model's path, else the policy."""
    model = getattr(policy, "model", None)
    if isinstance(model, str) and model:
        return model
    name = getattr(policy, "name", policy_name) if not isinstance(policy, str) else policy_name
    return name.removeprefix("hf:")


def failure(report: dict[str, Any]) -> str | None:
    """Why the run failed as a whole: every episode aborted, or any for a configuration reason;
    each distinct reason in full, once. None when the run counts."""
    reasons = report.get("abort_reasons") or {}
    config = [r for r in reasons if r.split(":", 1)[0] in CONFIG_ERRORS]
    if not reasons or (sum(reasons.values()) < report["total"] and not config):
        return None
    head = ("every episode aborted" if sum(reasons.values()) == report["total"]
            else "episodes aborted for a configuration reason")
    return "\n".join([f"error: {head}:"] + [f"  [{n}x] {r}" for r, n in reasons.items()])


def write_outputs(out: Path, rows: list[dict[str, Any]], report: dict[str, Any], *, family: str,
                  model_name: str) -> None:
    """results.jsonl, report.json and, for SWE, predictions.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    if family == "swe":
        with open(out / "predictions.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({"instance_id": r["task_id"], "model_name_or_path": model_name,
                                    "model_patch": r["outcome"].get("model_patch", "")}) + "\n")
    with open(out / "results.jsonl", "w") as f:
        for r in rows:  # the patches are in predictions.jsonl
            outcome = {k: v for k, v in r["outcome"].items() if k != "model_patch"}
            resolved = {"resolved": r["success"]} if family == "swe" else {}
            f.write(json.dumps({**r, **resolved, "outcome": outcome}) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")


def summary_line(report: dict[str, Any], output: str | Path) -> str:
    """The line printed at the end of a run."""
    word = "resolved" if report["env"] == "swe" else "succeeded"
    mean = report["mean_outcome"]
    return (f"{report['env']} / {report['policy']}: {report['succeeded']}/{report['total']} {word} "
            f"({100 * report['success_rate']:.1f}%), mean outcome "
            f"{'n/a' if mean is None else f'{mean:+.2f}'}, {report['aborted']} aborted, "
            f"{report['skipped']} skipped{_infrastructure_note(report)} -> {output}")


def _infrastructure_note(report: dict[str, Any]) -> str:
    """``, infrastructure: 2 sandbox died`` when some failures were the infrastructure's."""
    infra = report.get("infrastructure") or {}
    return f", infrastructure: {', '.join(f'{n} {k}' for k, n in infra.items())}" if infra else ""


def check_args(args: argparse.Namespace) -> None:
    """Flags that cannot work, refused before anything starts; a policy URL is probed and its
    model name worked out (``--model`` when ``/v1/models`` cannot say). Raises ``ValueError``."""
    if args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1, got {args.max_steps}")
    if args.temperature is not None and args.temperature < 0:
        raise ValueError(f"--temperature must be non-negative, got {args.temperature}")
    for flag in ("max_response_tokens", "max_context_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise ValueError(f"--request-timeout must be positive, got {args.request_timeout}")
    if args.retries is not None and args.retries < 0:
        raise ValueError(f"--retries must be at least 0, got {args.retries}")
    url = args.policy.startswith(("http://", "https://"))
    if not url and (args.request_timeout is not None or args.retries is not None):
        raise ValueError("--request-timeout and --retries bound a URL policy's requests; "
                         f"--policy {args.policy} makes none")
    if args.max_response_tokens is not None and args.policy in ORACLE_KINDS:
        raise ValueError(f"--max-response-tokens bounds a model policy's actions; --policy {args.policy} has no model")
    if args.model and args.model.startswith(("http://", "https://")):
        raise ValueError(f"--model is the model's name on the server, not a URL ({args.model}); "
                         "give the URL as --policy")
    if args.policy.startswith(("http://", "https://")):
        from nextstate.train.wiring import probe_server
        args.model = probe_server(args.policy, args.model, "--model", what="policy URL")
    elif args.policy not in ORACLE_KINDS:
        from nextstate.train.wiring import check_model
        check_model(args.policy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--env", required=True, help=f"a registered env family: {', '.join(registry.names())}; "
                   "or MODULE:NAME (imports MODULE, which registers NAME), or NAME when its module is named NAME")
    p.add_argument("--tasks", default="builtin", help="task file/directory or dataset name (default builtin)")
    p.add_argument("--policy", required=True,
                   help="gold, noop, a preset (tiny, smollm2, ...), a model path/name or a server URL")
    p.add_argument("--model", help="model name on the server (with a URL policy)")
    p.add_argument("--parallel", type=int, default=4, help="episodes at once (default 4)")
    p.add_argument("--output", required=True, help="directory for the results")
    p.add_argument("--max-steps", type=int, help="steps before an episode is truncated")
    p.add_argument("--ids", help="comma-separated task ids to run (default all)")
    p.add_argument("--backend", default="auto", choices=["auto", "docker", "local"], help="sandbox backend")
    p.add_argument("--grade-network", choices=["on", "off"],
                   help="SWE: network in the grading container (default on, as swebench's harness)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default 1.0; a trainer's eval.temperature)")
    p.add_argument("--top-p", type=float, help="nucleus sampling (default 1.0; a trainer's rollout.top_p)")
    p.add_argument("--no-system-prompt", action="store_true",
                   help="no system turn and no tool list, as rollout.system_prompt=false (the CPU demo)")
    p.add_argument("--max-response-tokens", type=int, help="tokens per action (rollout.max_response_tokens)")
    p.add_argument("--max-context-tokens", type=int, help="prompt plus action budget (rollout.max_context_tokens)")
    p.add_argument("--request-timeout", type=float,
                   help="seconds before a URL policy's request is given up (and its connection closed; default 300)")
    p.add_argument("--retries", type=int, help="retries of a URL policy's failed request (default 4)")
    args = p.parse_args(argv)
    policy_kwargs = {k: v for k, v in (("timeout", args.request_timeout), ("max_retries", args.retries))
                     if v is not None}
    try:
        INTERRUPT.catching = True
        check_args(args)
        chat = ChatConfig(**{k: v for k, v in (("context_tokens", args.max_context_tokens),
                                               ("max_response_tokens", args.max_response_tokens)) if v},
                          system_prompt=not args.no_system_prompt)
        sampling = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v is not None}
        report = evaluate(registry.resolve(args.env), args.tasks, args.policy, parallel=args.parallel, output=args.output,
                          max_steps=args.max_steps, model=args.model, backend=args.backend,
                          ids=args.ids.split(",") if args.ids else None,
                          env_kwargs=({"grade_network": args.grade_network == "on"}
                                      if args.grade_network else None), chat=chat, sampling=sampling,
                          policy_kwargs=policy_kwargs)
    except (ValueError, OSError, RuntimeError) as e:  # bad tasks or flags, no Docker engine
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError) as e:   # the latter: an interrupted event loop
        if isinstance(e, asyncio.CancelledError) and not INTERRUPT.raised:
            raise
        INTERRUPT.report()
        return 130
    print(summary_line(report, args.output))
    failed = failure(report)
    if failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    INTERRUPT.exit(main())
