"""Step advantages on a veRL ``DataProto`` and the ``nextstate`` trainer mode's TransferQueue glue."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.protocol import DataProto

from nextstate.train.advantage import EPS, StepRows, compute_advantages
from nextstate.train.config import load_config
from nextstate.train.verl_backend import advantage as vadv

NAN = float("nan")


def _dataproto(uid, steps, outcome, votes, lengths, padding=None, aborted=None) -> DataProto:
    n = len(uid)
    width = max(lengths)
    mask = torch.zeros((n, width), dtype=torch.int64)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    nt = {"uid": np.array(uid, dtype=object), vadv.FIELD_STEP: np.array(steps, dtype=object),
          vadv.FIELD_OUTCOME: np.array(outcome, dtype=object), vadv.FIELD_VOTE_MEAN: np.array(votes, dtype=object),
          vadv.FIELD_STATE: np.array([0] * n, dtype=object),
          vadv.FIELD_EPISODE: np.array([f"{u}/{i}" for i, u in enumerate(uid)], dtype=object),
          vadv.FIELD_ABORTED: np.array(aborted or [False] * n, dtype=object),
          "is_padding": np.array(padding or [False] * n, dtype=object)}
    return DataProto(batch=TensorDict({"response_mask": mask}, batch_size=n), non_tensor_batch=nt)


def test_dataproto_advantages_equal_the_shared_function():
    uid = ["u1", "u1", "u1", "u1", "u1", "u2", "u2", "u2"]
    steps = [0, 0, 1, 1, 2, 0, 0, 0]
    outcome = [1, 0, 1, 0, 1, 1, 0, 0]
    votes = [NAN, 1.0, 0.5, 0.0, NAN, 0.0, 1.0, 0.0]
    lengths = [3, 2, 4, 1, 2, 3, 3, 5]
    data, metrics = vadv.step_advantages(_dataproto(uid, steps, outcome, votes, lengths))
    shared = compute_advantages(StepRows(group=uid, step=steps, outcome=outcome, vote_mean=votes))
    per_row = data.batch["advantages"].sum(-1) / data.batch["response_mask"].sum(-1).clamp(min=1)
    np.testing.assert_allclose(per_row.numpy(), shared.advantages.astype(np.float32), rtol=1e-6)
    # every token of a kept response carries its step's advantage; dropped rows lose their mask
    assert data.batch["response_mask"].sum(-1).tolist() == [0, 0, 4, 1, 2, 3, 3, 5]
    assert torch.equal(data.batch["returns"], data.batch["advantages"])
    assert metrics["nextstate/dropped_buckets"] == 1 and metrics["nextstate/dropped_samples"] == 2


def test_dataproto_trajectory_estimator_equals_the_shared_function():
    uid = ["u1", "u1", "u1", "u1", "u2", "u2"]
    episodes = ["a", "a", "b", "b", "c", "d"]
    steps, outcome, votes = [0, 1, 0, 1, 0, 0], [1, 1, 0, 0, 1, 1], [1.0, -1.0, 0.5, NAN, 1.0, 0.0]
    proto = _dataproto(uid, steps, outcome, votes, [2] * 6)
    proto.non_tensor_batch[vadv.FIELD_EPISODE] = np.array(episodes, dtype=object)
    data, metrics = vadv.step_advantages(proto, key="trajectory")
    shared = compute_advantages(StepRows(group=uid, step=steps, outcome=outcome, vote_mean=votes, episode=episodes),
                                "trajectory")
    h = 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(shared.advantages, [h + 1, h - 1, -h, -h, 0, 0], atol=1e-12)
    np.testing.assert_allclose(data.batch["advantages"][:, 0].numpy(), shared.advantages.astype(np.float32), rtol=1e-6)
    assert data.batch["response_mask"].sum(-1).tolist() == [2, 2, 2, 2, 0, 0]   # u2: nothing to learn
    assert metrics["nextstate/episode_length_mean"] == pytest.approx(1.5)


def test_dataproto_padding_and_aborted_rows_are_left_out():
    uid = ["u", "u", "u", "pad"]
    data, metrics = vadv.step_advantages(_dataproto(uid, [0, 0, 0, 0], [1, 0, 1, 0], [NAN] * 4, [2, 2, 2, 2],
                                                    padding=[False, False, False, True],
                                                    aborted=[False, False, True, False]))
    half = 0.5 / (0.5 + EPS)
    assert data.batch["advantages"][:, 0].tolist() == pytest.approx([half, -half, 0.0, 0.0])
    assert data.batch["response_mask"].sum(-1).tolist() == [2, 2, 0, 0]
    assert metrics["nextstate/aborted_episodes"] == 1


def test_trainer_override_reads_and_writes_transfer_queue_fields(monkeypatch):
    pytest.importorskip("transfer_queue", reason="veRL's TransferQueue trainer stack is not installed")
    pytest.importorskip("verl.trainer.ppo.v1", reason="veRL's V1 trainer stack is not installed")
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from nextstate.train.verl_backend import trainer as vtrainer

    rows = [("u1", 0, 1.0, NAN, 3), ("u1", 0, 0.0, NAN, 2), ("u1", 1, 1.0, 1.0, 4), ("u2", 0, 1.0, NAN, 1)]
    store = list_of_dict_to_tensordict([
        {"uid": u, "response_mask": torch.ones(n, dtype=torch.int64),
         "extra_fields": {vadv.FIELD_STEP: s, vadv.FIELD_OUTCOME: o, vadv.FIELD_VOTE_MEAN: v,
                          vadv.FIELD_STATE: 0, vadv.FIELD_EPISODE: f"{u}/{i}", vadv.FIELD_ABORTED: False}}
        for i, (u, s, o, v, n) in enumerate(rows)])
    written = {}

    class FakeTQ:
        @staticmethod
        def kv_batch_get(keys, partition_id, select_fields):
            return store.select(*select_fields)

        @staticmethod
        def kv_batch_put(keys, partition_id, fields):
            written.update(fields=fields, keys=keys)
            return KVBatchMeta(partition_id=partition_id, keys=keys, tags=[{}] * len(keys),
                               fields=list(fields.keys()))

    monkeypatch.setattr(vtrainer, "tq", FakeTQ)
    cfg = load_config("terminal")
    trainer = object.__new__(vtrainer.NextStateTrainer)
    trainer.config = OmegaConf.create({"nextstate": cfg.to_dict()})
    batch = KVBatchMeta(partition_id="train", keys=[f"k{i}" for i in range(4)], tags=[{}] * 4)
    metrics: dict = {}
    returned = trainer._compute_advantage(batch, metrics)
    assert "advantages" in returned.fields        # the actor update reads the fields the meta names

    shared = compute_advantages(StepRows(group=["u1", "u1", "u1", "u2"], step=[0, 0, 1, 0],
                                         outcome=[1, 0, 1, 1], vote_mean=[NAN, NAN, 1.0, NAN]))
    fields = written["fields"]
    assert set(fields.keys()) == {"advantages", "returns", "response_mask", "loss_mask"}
    adv = [t.tolist() for t in fields["advantages"].unbind()]
    assert [len(a) for a in adv] == [3, 2, 4, 1]
    for row, value in zip(adv, shared.advantages):
        assert row == pytest.approx([value] * len(row), rel=1e-6)
    assert metrics["nextstate/buckets"] == shared.buckets
    assert trainer.trainer_mode == "sync"


def test_teacher_entries_put_the_teacher_context_before_the_same_response():
    """By hand: the copy veRL's worker scores is teacher prompt + response, with 1-D positions, and
    veRL's ``response_from_nested`` takes its response tokens' log-probs from the right places."""
    pytest.importorskip("transfer_queue", reason="veRL's TransferQueue trainer stack is not installed")
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.workers.utils.padding import response_from_nested

    from nextstate.train.verl_backend.trainer import teacher_entries

    source = list_of_dict_to_tensordict([{
        "prompts": torch.tensor([1, 2, 3]), "responses": torch.tensor([4, 5]), "response_mask": torch.ones(2),
        "loss_mask": torch.ones(2), "input_ids": torch.tensor([1, 2, 3, 4, 5]), "position_ids": torch.arange(5),
        "uid": "u", "extra_fields": {"x": 1}}])
    [entry] = teacher_entries(source, [[1, 2, 9, 3]])
    assert entry["prompts"].tolist() == [1, 2, 9, 3] and entry["responses"].tolist() == [4, 5]
    assert entry["input_ids"].tolist() == [1, 2, 9, 3, 4, 5]
    assert entry["position_ids"].tolist() == [0, 1, 2, 3, 4, 5] and entry["attention_mask"].tolist() == [1] * 6
    assert entry["response_mask"].tolist() == [1, 1] and entry["uid"] == "u" and entry["extra_fields"] == {"x": 1}
    assert source[0]["prompts"].tolist() == [1, 2, 3]             # the step's own sample is unchanged
    # veRL's log-prob layout: position t scores token t + 1, so the response [4, 5] is read at 3 and 4
    full = torch.nested.as_nested_tensor([torch.arange(6, dtype=torch.float32)], layout=torch.jagged)
    mask = torch.nested.as_nested_tensor([entry["response_mask"]], layout=torch.jagged)
    assert response_from_nested(full, mask).unbind()[0].tolist() == [3.0, 4.0]


class FakeStore:
    """TransferQueue's key-value calls on a dict: a stand-in for its Ray storage actors."""

    def __init__(self):
        self.data: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta
        for i, key in enumerate(keys):
            row = self.data.setdefault((partition_id, key), {})
            row.update({k: fields[i][k] for k in fields.keys()})
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags or [{}] * len(keys),
                           fields=list(fields.keys()))

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        """Sequence fields come back jagged (nested), whatever their lengths, as from TransferQueue."""
        from tensordict import NonTensorStack
        rows = [self.data[(partition_id, k)] for k in keys]
        out = {}
        for f in select_fields or rows[0]:
            values = [r[f] for r in rows]
            out[f] = torch.nested.as_nested_tensor(values, layout=torch.jagged) \
                if all(isinstance(v, torch.Tensor) and v.dim() for v in values) else NonTensorStack(*values)
        return TensorDict(out, batch_size=len(rows))

    def kv_clear(self, keys, partition_id):
        for k in keys:
            del self.data[(partition_id, k)]


class TinyRefWorkers:
    """Stands in for veRL's reference worker group (Ray actors, exercised by tests/test_verl_cpu.py):
    ``compute_ref_log_prob`` reads the named samples from the store, scores ``input_ids`` with the
    ``tiny`` model and writes ``log_probs`` in veRL's layout (position t: log p of token t + 1)."""

    def __init__(self, store, dp):
        from nextstate.agents.tiny import load_tiny
        self.model, _ = load_tiny(0)
        self.store, self._dispatch_info, self.seen = store, {"ref": list(range(dp))}, []

    def compute_ref_log_prob(self, meta):
        rows = []
        for key in meta.keys:
            ids = self.store.data[(meta.partition_id, key)]["input_ids"]
            self.seen.append(ids.tolist())
            with torch.no_grad():
                logits = self.model(ids[None]).logits[0] / meta.extra_info["temperature"]
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
            rows.append(torch.cat([lp, torch.zeros(1)]))
        self.store.kv_batch_put(meta.keys, meta.partition_id, TensorDict(
            {"log_probs": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, batch_size=len(rows)))
        return meta


def test_trainer_scores_hinted_samples_with_the_reference_worker_in_their_teacher_context(monkeypatch):
    pytest.importorskip("transfer_queue", reason="veRL's TransferQueue trainer stack is not installed")
    pytest.importorskip("verl.trainer.ppo.v1", reason="veRL's V1 trainer stack is not installed")
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from nextstate.train.verl_backend import trainer as vtrainer

    store = FakeStore()
    teacher_prompt = [1, 2, 9, 3]
    samples = [(0, 1.0, teacher_prompt), (1, 0.0, None), (2, 0.0, teacher_prompt)]   # the last is veRL padding
    keys = [f"u1_{i}_0" for i, _, _ in samples]
    store.kv_batch_put(keys, "train", list_of_dict_to_tensordict([
        {"uid": "u1", "prompts": torch.tensor([1, 2, 3]), "responses": torch.tensor([4, 5]),
         "input_ids": torch.tensor([1, 2, 3, 4, 5]), "position_ids": torch.arange(5),
         "response_mask": torch.ones(2, dtype=torch.int64), "loss_mask": torch.ones(2, dtype=torch.int64),
         "old_log_probs": torch.tensor([-1.0, -2.0]),
         "extra_fields": {vadv.FIELD_STEP: 0, vadv.FIELD_OUTCOME: o, vadv.FIELD_VOTE_MEAN: NAN, vadv.FIELD_STATE: 0,
                          vadv.FIELD_EPISODE: f"u1/{i}", vadv.FIELD_ABORTED: False, vadv.FIELD_TEACHER_PROMPT: t}}
        for i, o, t in samples]))
    monkeypatch.setattr(vtrainer, "tq", store)
    cfg = load_config("terminal", overrides=["opd.mode=combine", "opd.weight_rl=0.5", "opd.weight_opd=2.0",
                                             "advantage.key=outcome"])
    trainer = object.__new__(vtrainer.NextStateTrainer)
    trainer.config = OmegaConf.create({"nextstate": cfg.to_dict(), "actor_rollout_ref": {"rollout": {"temperature": 1.0}}})
    trainer.ref_in_actor, trainer.use_reference_policy = False, True
    trainer.ref_policy_wg = workers = TinyRefWorkers(store, dp=2)
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{}, {}, {"is_padding": True}])
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)

    # one hinted sample, repeated to the data-parallel size 2; scored as teacher prompt + response
    assert workers.seen == [teacher_prompt + [4, 5]] * 2
    assert not [k for k in store.data if k[0] == vtrainer.TEACHER_PARTITION]   # the copies are cleared
    with torch.no_grad():
        lp = torch.log_softmax(workers.model(torch.tensor([teacher_prompt + [4, 5]])).logits[0], -1)
    teacher = [lp[3, 4].item(), lp[4, 5].item()]
    a = 1.0 / (1.0 + EPS)      # outcome GRPO of the two real samples (1 and 0): A = +-0.5 / (0.5 + eps)
    expected = [2.0 * (teacher[0] + 1.0) + 0.5 * a, 2.0 * (teacher[1] + 2.0) + 0.5 * a]
    hinted, plain, padding = (store.data[("train", k)] for k in keys)
    assert hinted["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    assert hinted[vtrainer.TEACHER_LOG_PROBS].tolist() == pytest.approx(teacher, abs=1e-5)
    assert plain["advantages"].tolist() == pytest.approx([-0.5 * a] * 2, abs=1e-5)
    assert padding["response_mask"].tolist() == [0, 0]
    assert metrics["opd/hinted_samples"] == 1
    assert metrics["opd/teacher_gap_mean"] == pytest.approx((teacher[0] + 1.0 + teacher[1] + 2.0) / 2, abs=1e-5)
