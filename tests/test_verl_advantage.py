"""Step advantages on a veRL ``DataProto`` and the ``nextstate`` trainer mode's TransferQueue glue."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.protocol import DataProto

from train.advantage import EPS, StepRows, compute_advantages
from train.config import load_config
from train.verl_backend import advantage as vadv

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

    from train.verl_backend import trainer as vtrainer

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
