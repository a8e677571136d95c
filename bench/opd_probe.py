"""Does a hindsight hint give On-Policy Distillation a signal a model can use? A cheap probe.

``python -m bench.opd_probe [--model smollm2] [--steps 16] [--updates 5] [--lr 1e-5] [--hint-source rules|judge]
[--json]``
prints one JSON object; no RL run, no timed assertion. The protocol, fixed before any figure was
seen:

1. **Hinted steps from real rollouts.** On ``outdir`` training seeds (``outdir:0:STEPS``), in real
   Docker sandboxes, a behaviour policy reads ``/app/note`` and then writes the word to
   ``/app/out/answer`` before the directory exists: the write fails (``No such file or
   directory``, exit 1). The step's prompt is the one the agent loop builds (the model's own chat
   template, the tools, the history). Its hint comes from the hint source training builds
   (:func:`train.wiring.make_hinter`), asked the request the rollout builds (task, history, action,
   next state): ``--hint-source rules`` (the default), the error's last line
   (:func:`judges.rules.rule_hint`); ``judge``, the model's own hindsight hint
   (:class:`judges.hints.HintJudge` on the probed policy's weights, with the judge config's votes,
   temperature and max_tokens, and ``HINT_TIMEOUT_S`` per request). The hint is appended to the
   last environment turn as :func:`judges.hints.teacher_messages` does in training. A step given no hint is left out of
   the gaps and the updates, as OPD leaves it out in training (``hinted`` counts the others;
   ``hint_votes``, ``answers_with_hint_text`` and ``unhinted_answers`` say what the source answered).
2. **The teacher gap.** With the teacher the frozen model (``opd.teacher=reference``), the mean
   per-token ``log pi_teacher(a | s + hint) - log pi_old(a | s)`` on the tokens of the reference
   action (``mkdir -p /app/out``, the step that should have been taken: ``gap_reference``) and of
   the failing write itself (``gap_sampled``). OPD points the right way only if
   ``gap_reference > 0 > gap_sampled``: the hint raises what should have been done and lowers
   what was done. The same gaps on the tokens after the two actions' shared prefix (the
   tool-call format and ``bash`` up to the command: ``*_after_prefix``) say whether the hint
   moves the command itself, apart from the format. ``--updates 0`` stops here.
3. **A few OPD updates on those steps alone** (the trainer's own :class:`train.learner.Learner`,
   ``opd.mode=opd``: per-token advantages are the teacher gap on the failing write; ``old``
   log-probs re-read before each update, as a fresh rollout would give them), then the student's
   mean per-token log-probability of the reference action in the plain context, ``before`` and
   ``after``. OPD trains only on what was sampled, so ``after > before`` means the push away
   from the failing write moved mass to the right action.

The behaviour policy is scripted so that every probed step is a failed write, whatever the
model would have sampled (an untrained instruct model writes prose, not tool calls); ``pi_old``
is the probed model's own probability of that action, as in training.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from typing import Any

from bench import finish, outdir_runs

log = logging.getLogger(__name__)

HINT_TIMEOUT_S = 3600.0   # judge.timeout for the probe: the default 60 s per hint request would cut off every answer on 2 CPU cores


def failed_writes(policy: Any, steps: int, parallel: int = 4) -> list[list[Any]]:
    """The episodes of ``outdir:0:steps`` (one per seed: read the note, then write before
    ``mkdir``) whose last step, the write, failed; each step with the next state it led to."""
    from nextstate.envs.terminal import outdir
    from nextstate.judges.rules import rule_hint

    runs = outdir_runs(policy, f"outdir:0:{steps}", lambda t: [outdir.READ, outdir.write(t.data["value"])], parallel)
    return [ep for ep in runs if ep and rule_hint(ep[-1].next_state)]


def token_log_probs(model: Any, rows: list[tuple[list[int], list[int]]], pad_id: int) -> list[list[float]]:
    """Per-token log-probs of each ``(prompt_ids, response_ids)`` row's response under ``model``."""
    import torch

    from nextstate.train.batch import Sample, collate
    from nextstate.train.loss import token_log_probs as response_log_probs

    out = []
    with torch.no_grad():
        for prompt, response in rows:   # one row at a time: no padding, little memory
            mb = collate([Sample(prompt, response, [0.0] * len(response), 0.0, 0.0)], pad_id)
            lp, _ = response_log_probs(model, mb.to(next(model.parameters()).device), 1.0)
            out.append(lp[0, :len(response)].tolist())
    return out


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common (at most one less than either length)."""
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return n


def mean_token(rows: list[list[float]]) -> float | None:
    """The mean over rows of each row's mean per-token value (None without rows)."""
    return round(statistics.fmean(statistics.fmean(r) for r in rows), 4) if rows else None


def ask_hints(hinter: Any, episodes: list[list[Any]]) -> list[Any]:
    """``hinter``'s :class:`~judges.prm.JudgeResult` (its ``hint`` None when it gave none) on the last
    step of each episode, asked the request the rollout builds."""
    from bench.judge_agreement import requests

    async def ask() -> list[Any]:
        return await asyncio.gather(*(hinter.judge(requests([ep])[-1]) for ep in episodes))
    return asyncio.run(ask())


def hint_answers(results: list[Any]) -> dict[str, Any]:
    """What the hint source answered: its votes over all answers (0: no ``\\boxed{}`` vote), the
    answers holding a hint of more than 10 characters whatever their vote, the requests that
    failed, and up to 2 answers of steps left unhinted (their first 600 characters)."""
    from nextstate.judges.prm import parse_hint

    answers = [a for r in results for a in r.raw]
    return {"hint_votes": {str(v): sum(x == v for r in results for x in r.votes) for v in (1, -1, 0)},
            "answers_with_hint_text": sum(len((parse_hint(a) or "").strip()) > 10 for a in answers),
            "hint_errors": sum(r.error is not None for r in results),
            "unhinted_answers": [r.raw[0][:600] for r in results if not r.hint and r.raw][:2]}


def probe(model: str = "smollm2", steps: int = 16, updates: int = 5, lr: float = 1e-5, seed: int = 0,
          parallel: int = 4, hint_source: str = "rules") -> dict[str, Any]:
    """The probe's figures (see the module docstring)."""
    from nextstate.agents.chat import action_text
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.envs.terminal import outdir
    from nextstate.judges.hints import teacher_messages
    from nextstate.train.batch import Batch, Sample
    from nextstate.train.config import load_config
    from nextstate.train.learner import Learner
    from nextstate.train.wiring import make_hinter

    t0 = time.monotonic()
    cfg = load_config("terminal", overrides=["opd.mode=opd", f"opd.hint_source={hint_source}",
                                             "opd.teacher=reference", f"train.lr={lr}", f"judge.timeout={HINT_TIMEOUT_S}"])
    policy = HFPolicy(model, seed=seed)
    try:
        episodes = failed_writes(policy, steps, parallel)
        if not episodes:
            raise RuntimeError("no failed write among the rollouts: the probe has nothing to measure")
        hinter = make_hinter(cfg, policy)
        asked = ask_hints(hinter, episodes)
        examples = [ep[-1] for ep, r in zip(episodes, asked) if r.hint]
        hints = [r.hint for r in asked if r.hint]
        tok = policy.tokenizer
        plain = [policy.prompt_ids(e.messages, e.tools) for e in examples]
        hinted = [policy.prompt_ids(teacher_messages(e.messages, h), e.tools) for e, h in zip(examples, hints)]
        sampled = [tok.encode(e.text, add_special_tokens=False) for e in examples]
        reference = tok.encode(action_text(outdir.MKDIR), add_special_tokens=False)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0

        def lps(m: Any, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
            return token_log_probs(m, list(zip(prompts, responses)), pad)

        def gap(responses: list[list[int]]) -> list[list[float]]:
            teacher, old = lps(policy.model, hinted, responses), lps(policy.model, plain, responses)
            return [[t - o for t, o in zip(tr, orow)] for tr, orow in zip(teacher, old)]
        refs = [reference] * len(examples)
        shared = [shared_prefix(reference, s) for s in sampled]   # the tool-call format both begin with
        gap_ref, gap_sampled = gap(refs), gap(sampled)
        j = cfg.judge
        figures: dict[str, Any] = {
            "model": model, "steps": len(episodes), "hint_source": hint_source, "hinted": len(examples),
            "hint_settings": None if hint_source == "rules" else
            {"votes": j.votes, "temperature": j.temperature, "max_tokens": j.max_tokens, "timeout_s": j.timeout},
            "teacher": "reference",
            "gap_reference": mean_token(gap_ref), "gap_sampled": mean_token(gap_sampled),
            "shared_prefix_tokens": min(shared, default=None),
            "gap_reference_after_prefix": mean_token([g[n:] for g, n in zip(gap_ref, shared)]),
            "gap_sampled_after_prefix": mean_token([g[n:] for g, n in zip(gap_sampled, shared)]),
            "hint_examples": hints[:3], **hint_answers(asked), "reference_action": action_text(outdir.MKDIR),
            "sampled_example": episodes[0][-1].text}
        if updates == 0 or not examples:   # no hinted step: nothing for OPD to train on
            return {**figures, "wall_s": round(time.monotonic() - t0, 1)}

        learner = Learner(policy, cfg)
        before_ref, before_sampled = lps(learner.model, plain, refs), lps(learner.model, plain, sampled)
        history = []
        for _ in range(updates):
            old = lps(learner.model, plain, sampled)   # what a fresh rollout of the same step would record
            batch = Batch([Sample(p, r, o, 0.0, 0.0, teacher_prompt_ids=h)
                           for p, r, o, h in zip(plain, sampled, old, hinted)], weight_opd=cfg.opd.weight_opd)
            out = learner.step(batch, progress=False)
            history.append({k: round(out[k], 4) for k in ("opd/teacher_gap_mean", "train/pg_loss", "train/grad_norm")
                            if k in out})
        after_ref, after_sampled = lps(learner.model, plain, refs), lps(learner.model, plain, sampled)
        figures.update({
            "before": mean_token(before_ref), "after": mean_token(after_ref),
            "sampled_before": mean_token(before_sampled), "sampled_after": mean_token(after_sampled),
            "updates": updates, "lr": lr, "update_log": history,
            "works": bool(figures["gap_reference"] > 0 > figures["gap_sampled"]
                          and mean_token(after_ref) > mean_token(before_ref)),
            "wall_s": round(time.monotonic() - t0, 1)})
        return figures
    finally:
        asyncio.run(policy.aclose())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.opd_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a preset or a model directory (default: smollm2)")
    ap.add_argument("--steps", type=int, default=16, help="failed writes to probe, one per outdir seed")
    ap.add_argument("--updates", type=int, default=5, help="OPD updates on those steps")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hint-source", choices=("rules", "judge"), default="rules",
                    help="rules: the error's last line; judge: the model's own hindsight hint (default: rules)")
    ap.add_argument("--parallel", type=int, default=4, help="sandboxes at once")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return finish("bench.opd_probe", lambda: probe(args.model, args.steps, args.updates, args.lr, args.seed,
                                                   args.parallel, args.hint_source),
                  args.json, (RuntimeError, FileNotFoundError, ValueError), model=args.model)


if __name__ == "__main__":
    sys.exit(main())
