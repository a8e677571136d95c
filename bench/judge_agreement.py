"""Does an LLM step judge agree with the rule judge on ``outdir``? And what do its hints say?

``python -m bench.judge_agreement [--model smollm2 | --url URL] [--tasks 8] [--votes 3] [--json]``
prints one JSON object. Protocol: the hasty behaviour policy (``train.sft --source hasty``:
reads half of the time, creates the directory before writing half of the time) plays
``outdir:0:TASKS`` in real sandboxes; every step is then judged twice from the same request
(task, history, action, next state):

* the rule judge (:func:`judges.rules.rule_vote`: -1 on a failed command, +1 otherwise), the
  reference here, since on ``outdir`` a step is wrong exactly when its command failed;
* the LLM judge (:class:`judges.prm.StepJudge` with the family's prompt, ``--votes`` answers per
  step at the config's temperature), on the model in process (``--model``, the policy's own
  weights as ``--judge policy`` uses them) or on an OpenAI-compatible server (``--url``, e.g.
  ``transformers serve`` on the converted checkpoint).

Figures: ``agreement`` (the LLM's majority equals the rule vote), Cohen's ``kappa``, the share of
answers that gave a valid ``\\boxed{}`` vote, the LLM's mean vote on the steps the rules call
right and wrong, and, from the hint source (:class:`judges.hints.HintJudge`), how often a hint
came on failed and on good steps with examples of each. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from typing import Any

from bench import outdir_runs, report


def requests(runs: list[list[Any]]) -> list[Any]:
    """One :class:`judges.prm.JudgeRequest` per step of ``runs``, as the agent loop builds it."""
    from nextstate.envs.terminal import outdir
    from nextstate.judges.prm import JudgeRequest

    out = []
    for ep in runs:
        for k, ex in enumerate(ep):
            history = [{"action": e.action, "next_state": e.next_state} for e in ep[:k]]
            out.append(JudgeRequest("terminal", outdir.INSTRUCTION, history, ex.action, ex.next_state))
    return out


def kappa(a: list[int], b: list[int]) -> float | None:
    """Cohen's kappa of two label lists (None when chance agreement is total)."""
    labels = set(a) | set(b)
    po = statistics.fmean(x == y for x, y in zip(a, b))
    pe = sum((a.count(v) / len(a)) * (b.count(v) / len(b)) for v in labels)
    return None if pe == 1 else round((po - pe) / (1 - pe), 4)


def measure(backend: Any, name: str, tasks: int, votes: int, max_tokens: int, parallel: int,
            timeout: float) -> dict[str, Any]:
    """The figures (see the module docstring) for the judge on ``backend``."""
    from nextstate.judges.hints import HintJudge
    from nextstate.judges.prm import StepJudge, parse_vote
    from nextstate.judges.rules import rule_vote
    from nextstate.train.config import JudgeConfig
    from nextstate.train.sft import hasty_plan

    t0 = time.monotonic()
    runs = outdir_runs(backend, f"outdir:0:{tasks}", lambda t: hasty_plan(t, random.Random(f"judge-{t.id}")), parallel)
    reqs = requests(runs)
    rules = [rule_vote(r.next_state)[0] for r in reqs]
    temperature = JudgeConfig().temperature
    judge = StepJudge(backend, m=votes, temperature=temperature, timeout=timeout, max_tokens=max_tokens)
    hinter = HintJudge(backend, m=1, temperature=temperature, timeout=timeout, max_tokens=max_tokens)

    async def run() -> tuple[list[Any], list[Any]]:
        return (await asyncio.gather(*(judge.judge(r) for r in reqs)),
                await asyncio.gather(*(hinter.judge(r) for r in reqs)))
    verdicts, hints = asyncio.run(run())
    llm = [int(v.score) for v in verdicts]
    parsed = [parse_vote(a) is not None for v in verdicts for a in v.raw]
    failed = [i for i, r in enumerate(rules) if r < 0]
    good = [i for i, r in enumerate(rules) if r > 0]

    def mean_vote(idx: list[int]) -> float | None:
        means = [verdicts[i].mean for i in idx if verdicts[i].mean is not None]
        return round(statistics.fmean(means), 4) if means else None

    def hinted(idx: list[int]) -> list[int]:
        return [i for i in idx if hints[i].hint]
    return {
        "judge": name, "family": "outdir", "tasks": tasks, "steps": len(reqs), "votes": votes,
        "temperature": temperature, "max_tokens": max_tokens,
        "rule_failed_steps": len(failed), "rule_good_steps": len(good),
        "agreement": round(statistics.fmean(x == y for x, y in zip(llm, rules)), 4), "kappa": kappa(llm, rules),
        "valid_vote_rate": round(statistics.fmean(parsed), 4) if parsed else 0.0,
        "errors": sum(v.error is not None for v in verdicts),
        "llm_vote_mean_on_rule_good": mean_vote(good), "llm_vote_mean_on_rule_failed": mean_vote(failed),
        "hint_rate_on_failed": round(len(hinted(failed)) / len(failed), 4) if failed else None,
        "hint_rate_on_good": round(len(hinted(good)) / len(good), 4) if good else None,
        "hint_examples_failed": [{"action": reqs[i].action, "hint": hints[i].hint} for i in hinted(failed)[:3]],
        "hint_examples_good": [{"action": reqs[i].action, "hint": hints[i].hint} for i in hinted(good)[:3]],
        "wall_s": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.judge_agreement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="the judge's model in process (a preset or a directory)")
    ap.add_argument("--url", help="judge on this OpenAI-compatible server instead of --model")
    ap.add_argument("--tasks", type=int, default=8, help="outdir training seeds played by the hasty policy")
    ap.add_argument("--votes", type=int, default=3, help="m: the judge's answers per step")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per judge answer")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per judge request")
    ap.add_argument("--parallel", type=int, default=4, help="sandboxes at once")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    if args.url:
        from nextstate.agents.openai_policy import OpenAIPolicy
        backend, name = OpenAIPolicy(args.url, timeout=args.timeout), args.url
    else:
        from nextstate.agents.hf_policy import HFPolicy
        try:
            backend, name = HFPolicy(args.model), args.model
        except FileNotFoundError as exc:
            print(f"bench.judge_agreement: {exc}", file=sys.stderr)
            return 1
    try:
        figures = measure(backend, name, args.tasks, args.votes, args.max_tokens, args.parallel, args.timeout)
    finally:
        asyncio.run(backend.aclose())
    report(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
