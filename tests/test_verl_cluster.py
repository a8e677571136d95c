"""Two nodes on one machine: the ``nextstate`` agent loop and the launcher's clean-up on a real
Ray cluster of two ``ray start`` processes, each node with a Docker engine of its own.

How it is built (all started and removed by the test itself, as root):

* two more ``dockerd``, each with its own socket, data root, exec root (so its own containerd)
  and pid file, in a network namespace of its own with no bridge or iptables rules (sandboxes
  have no network), and the terminal image loaded into it from the host's engine
  (``docker save | docker -H ... load``). The host's own engine serves only that
  ``docker save``: the nodes' engines start clean, whatever else the host's engine is doing
  (other runs, other tests);
* ``ray start --head`` with a custom resource ``node_a`` and ``DOCKER_HOST`` set to the first
  engine, ``ray start --address`` with ``node_b`` and the second engine, in a Ray temp dir of
  their own, token auth off, every process marked by an environment variable so the test stops
  exactly its own (``ray stop`` would stop other Ray clusters on the host).

veRL's trainer does not run on it: a veRL run on CPU holds ~5.5 GB in 13 processes and takes
minutes per step on this machine's 2 shared cores, and the multi-node part of it is veRL's own
(its agent-loop manager puts workers on the nodes round-robin). What is ours is driven
directly: one Ray actor per node plays episodes the way veRL's agent-loop workers do
(:class:`NextStateAgentLoop` objects sharing the process's :class:`EpisodeResources`:
sandbox pool, rollout log), under the run's environment from
:func:`train.verl_backend.launch.compose`; the launcher's clean-up
(:func:`train.verl_backend.nodes.clean_cluster`) runs at start and at exit. The LLM server is
a scripted stand-in (:class:`ScriptedServer`): vLLM and SGLang need GPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="veRL's agent-loop stack is not installed")

REPO = Path(__file__).resolve().parents[1]
CLUSTER_MARK = "NEXTSTATE_TEST_CLUSTER"
TOOL_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]


class ScriptedServer:
    """Stands in for veRL's LLM server client (vLLM/SGLang replicas need GPUs): every answer is
    one Python tool call, as token ids of the tiny tokenizer, with zero log-probs."""

    def __init__(self, tokenizer: Any):
        self.ids = tokenizer.encode(TOOL_CALL, add_special_tokens=False)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput
        ids = self.ids[:int(sampling_params.get("max_tokens") or len(self.ids))]
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


class NodeWorker:
    """One node's agent-loop worker: plays episodes with the ``nextstate`` loop in this process."""

    def __init__(self, config: Any):
        from nextstate.agents.tiny import load_tokenizer
        import nextstate.train.verl_backend.plugin  # noqa: F401 - registers the loop

        self.config, self.tokenizer = config, load_tokenizer()
        self.server = ScriptedServer(self.tokenizer)

    def where(self) -> dict[str, Any]:
        import ray
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "engine": os.environ.get("DOCKER_HOST")}

    async def play(self, task_ids: list[str], uid: str) -> list[int]:
        """One episode per task (a fresh loop object each, as veRL makes them); outputs per episode."""
        import asyncio

        import hydra
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
        from verl.utils.dataset.rl_dataset import RLHFDataset

        async def one(i: int, task_id: str) -> int:
            loop = hydra.utils.instantiate(_agent_loop_registry["nextstate"], trainer_config=DictConfigWrap(self.config),
                                           server_manager=self.server, tokenizer=self.tokenizer, processor=None,
                                           dataset_cls=RLHFDataset, data_config=DictConfigWrap(self.config.data),
                                           hf_model_type="qwen2", tools=ToolListWrap([]))
            outputs = await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=[],
                                     extra_info={"task_id": task_id}, uid=f"{uid}-{i}", session_id=0)
            return len(outputs)

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids))))

    def settle(self) -> None:
        """Wait until the process's sandbox pool is full again (no start under way)."""
        from nextstate.train.verl_backend import agent_loop
        for res in agent_loop._resources.values():
            res.pool.wait_ready(timeout=300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_marked(variable: str, timeout: float = 60.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process whose environment holds ``variable``; those left."""
    from nextstate.train.verl_backend.nodes import processes_with
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_with(variable):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout / 2
        while processes_with(variable) and time.monotonic() < deadline:
            time.sleep(0.5)
    return processes_with(variable)


def _parent(proc: Path) -> int:
    """The parent pid of a /proc entry (0 when it is gone)."""
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _kill_trees(pids: list[int]) -> None:
    """SIGKILL ``pids`` and their descendants (an engine's shims left behind, and their containers)."""
    parents = {int(p.name): _parent(p) for p in Path("/proc").glob("[0-9]*")}
    doomed, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        doomed.add(pid)
        todo += [child for child, parent in parents.items() if parent == pid and child not in doomed]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Engine:
    """A ``dockerd`` of the test's under ``root`` (see the module docstring): :meth:`kill` makes
    it die mid-run, :meth:`remove` stops it and deletes everything it had."""

    def __init__(self, root: Path):
        self.root = root
        self.host = f"unix://{root / 'docker.sock'}"
        self.pidfile = root / "docker.pid"
        self.proc: subprocess.Popen | None = None
        (root / "daemon.json").write_text("{}")

    def start(self) -> None:
        r = self.root
        cmd = ["dockerd", "--config-file", str(r / "daemon.json"), "--host", self.host, "--data-root", str(r / "data"),
               "--exec-root", str(r / "exec"), "--pidfile", str(self.pidfile), "--bridge=none", "--iptables=false",
               "--ip-masq=false", "--ip6tables=false"]
        with (r / "dockerd.log").open("ab") as log:
            # its own network namespace: a dockerd with --bridge=none deletes the interface
            # docker0 where it starts, which would cut the host engine's bridge network
            self.proc = subprocess.Popen(["nice", "-n", "15", "unshare", "--net", *cmd], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 120
        while not self.answers():
            assert time.monotonic() < deadline, (r / "dockerd.log").read_text()[-3000:]
            time.sleep(0.5)

    def answers(self) -> bool:
        from nextstate.containers.pool import docker_available
        return docker_available(self.host)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """The engine dies with its containers: SIGKILL to dockerd, its containerd, the shims and
        the containers' processes. (A shim left alive with an exec session open can keep a
        restarted containerd from starting.)"""
        assert self.running()
        self._kill_all()
        self.proc.wait(timeout=60)           # reaped: a zombie's pid file would stop the restart
        while self.answers():
            time.sleep(0.1)

    def _kill_all(self) -> None:
        _kill_trees([int(p.name) for p in Path("/proc").glob("[0-9]*") if str(self.root).encode() in _cmdline(p)])

    def remove(self) -> None:
        """Stop dockerd (it stops its containers and containerd), unmount and delete its root."""
        if self.running():
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        self._kill_all()
        if self.proc is not None:
            self.proc.wait(timeout=60)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.root))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


    def load(self, image: str) -> None:
        """``docker save IMAGE`` from the host's engine into this one."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        load = subprocess.run(["nice", "-n", "15", "docker", "-H", self.host, "load"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=900)
        save.stdout.close()
        assert save.wait() == 0 and load.returncode == 0, load.stderr


@contextlib.contextmanager
def node_engines(image: str, names: tuple[str, ...]) -> Iterator[dict[str, Engine]]:
    """One started engine per node name, ``image`` loaded into each; all removed on the way out."""
    from concurrent.futures import ThreadPoolExecutor

    engines = {name: Engine(Path(tempfile.mkdtemp(prefix=f"ns-{name}-"))) for name in names}
    try:
        for engine in engines.values():
            engine.start()
        with ThreadPoolExecutor(len(engines)) as pool:
            list(pool.map(lambda e: e.load(image), engines.values()))
        yield engines
    finally:
        for engine in engines.values():
            engine.remove()


@contextlib.contextmanager
def ray_cluster(root: Path, engines: dict[str, Engine]) -> Iterator[dict[str, Any]]:
    """``ray start --head`` (resource node_a) and ``ray start --address`` (node_b), each with
    DOCKER_HOST set to its node's engine; yields the GCS address. Every process of it is stopped
    on the way out."""
    mark = f"{CLUSTER_MARK}={uuid.uuid4().hex[:12]}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1], "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start", "--disable-usage-stats",
               "--num-gpus=0", "--object-store-memory=100000000", f"--dashboard-agent-listen-port={_free_port()}"]
    try:
        subprocess.run(["nice", "-n", "15", *ray_cli, "--head", f"--port={_free_port()}", f"--temp-dir={root}",
                        "--num-cpus=2", '--resources={"node_a": 1}', "--include-dashboard=false",
                        f"--dashboard-port={_free_port()}"],
                       env={**env, "DOCKER_HOST": engines["node_a"].host}, check=True, capture_output=True, timeout=300)
        address = (root / "ray_current_cluster").read_text().strip()
        ray_cli[-1] = f"--dashboard-agent-listen-port={_free_port()}"
        subprocess.run(["nice", "-n", "15", *ray_cli, f"--address={address}", "--num-cpus=2",
                        '--resources={"node_b": 1}'],
                       env={**env, "DOCKER_HOST": engines["node_b"].host}, check=True, capture_output=True, timeout=300)
        yield {"address": address, "mark": mark}
    finally:
        assert _stop_marked(mark) == [], "processes of the test's Ray cluster outlived SIGKILL"


def _plant_leftover(client: Any, image: str) -> str:
    """A container labelled as a sandbox of a dead process on this host: what a killed run leaves."""
    from nextstate import containers
    from nextstate.containers.engine import PID_LABEL
    dead = subprocess.Popen(["true"])
    dead.wait()
    labels = {**containers.owner_labels(f"leftover-{uuid.uuid4().hex[:8]}"), PID_LABEL: str(dead.pid)}
    return client.containers.create(image, "true", labels=labels, network_mode="none").id


def _run_containers(client: Any, run_id: str) -> list[dict]:
    from nextstate.containers.reap import project_containers
    return project_containers(client, run_id)


def _trajectories(output: Path) -> dict[str, dict]:
    """The episodes' last records, from every rollout log of the run, by group id."""
    out = {}
    for path in output.glob("rollouts*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["kind"] == "trajectory":
                out[rec["group_id"]] = {**rec, "log": path.name}
    return out


def _wait_for(output: Path, n: int, timeout: float = 60.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while len(found := _trajectories(output)) < n and time.monotonic() < deadline:
        time.sleep(0.5)           # the recorders flush every second
    return found


def test_two_nodes_each_on_its_own_engine_reaped_merged_and_surviving_an_engine_death(
        tmp_path, terminal_image, monkeypatch):
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        if os.environ.get("CI"):
            pytest.fail("CI runs as root with dockerd installed (.ci/setup)")
        pytest.skip("the nodes' Docker engines need root and dockerd")
    import docker
    import ray

    from nextstate.train.config import load_config
    from nextstate.train.wiring import load_tasks
    from nextstate.train.verl_backend import RUN_ENV
    from nextstate.train.verl_backend.launch import compose
    from nextstate.train.verl_backend.nodes import clean_cluster, processes_with, run_processes
    from nextstate.viewer import RunIndex, main

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    output = tmp_path / "run"
    cfg = load_config("toolcall", cpu_demo=True, overrides=[
        "env.sandbox_backend=docker", "env.max_steps=2", "judge.mode=none", "rollout.max_response_tokens=128",
        "rollout.max_context_tokens=4096", "rollout.parallel=4", f"run.output={output}", "verl.agent_workers=2",
        "verl.n_gpus_per_node=1", "verl.device=gpu"])   # a GPU cluster's settings: as many agent-loop workers as asked
    tasks = [t.id for t in load_tasks(cfg)]
    config = compose(cfg, len(tasks))
    run_env = dict(config.ray_kwargs.ray_init.runtime_env.env_vars)     # what the launcher hands veRL's workers
    run_id = run_env[RUN_ENV]
    import_path = {"PYTHONPATH": str(REPO)}
    left: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        engines = stack.enter_context(node_engines(terminal_image, ("node_a", "node_b")))
        ray_root = Path(tempfile.mkdtemp(prefix="ns-ray-"))
        stack.callback(shutil.rmtree, ray_root, True)
        cluster = stack.enter_context(ray_cluster(ray_root / "ray", engines))
        clients = {name: docker.DockerClient(base_url=e.host) for name, e in engines.items()}
        for client in clients.values():
            stack.callback(client.close)
        left["roots"], left["mark"] = [ray_root, *(e.root for e in engines.values())], cluster["mark"]
        hosts = {e.host for e in engines.values()}

        # start: dead runs' sandboxes go on every node, each from its own engine
        planted = {name: _plant_leftover(client, terminal_image) for name, client in clients.items()}
        started = clean_cluster(None, address=cluster["address"], env_vars=import_path)
        assert len(started) == 2 and {r["engine"] for r in started.values()} == hosts
        assert all(r["error"] is None and r["removed"] == 1 for r in started.values()), started
        for name, cid in planted.items():
            with pytest.raises(docker.errors.NotFound):
                clients[name].containers.get(cid)

        # the run: one agent-loop worker per node, under the run's environment
        ray.init(address=cluster["address"], namespace=f"nextstate-{run_id}", log_to_driver=False,
                 runtime_env={"env_vars": {**run_env, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}})
        stack.callback(lambda: ray.is_initialized() and ray.shutdown())
        nodes = {name: n["NodeID"] for n in ray.nodes() if n["Alive"] for name in engines if name in n["Resources"]}
        worker = ray.remote(NodeWorker)
        workers = {name: worker.options(resources={name: 0.1}, num_cpus=0, lifetime="detached",
                                        name=f"worker-{name}").remote(config) for name in nodes}
        where = {name: ray.get(w.where.remote(), timeout=600) for name, w in workers.items()}
        assert {name: w["node"] for name, w in where.items()} == nodes
        assert {name: w["engine"] for name, w in where.items()} == {name: e.host for name, e in engines.items()}
        pids = {name: w["pid"] for name, w in where.items()}

        first = ray.get([workers[n].play.remote(tasks[:2], f"r1{n[-1]}") for n in nodes], timeout=600)
        assert first == [[2, 2], [2, 2]]                    # every step of every episode is an output
        ray.get([w.settle.remote() for w in workers.values()], timeout=600)
        owners = {name: {c["Labels"]["io.nextstate.owner-pid"] for c in _run_containers(client, run_id)}
                  for name, client in clients.items()}
        assert owners == {name: {str(pid)} for name, pid in pids.items()}   # each node's sandboxes on its engine

        # node b's engine dies mid-run (its sandboxes with it): its episodes are aborted, at once
        # rather than after the lease timeout, and both workers carry on
        engines["node_b"].kill()
        second = ray.get([workers["node_a"].play.remote(tasks[:2], "r2a"),
                          workers["node_b"].play.remote(tasks[:3], "r2b")], timeout=300)
        assert second[0] == [2, 2] and len(second[1]) == 3
        ray.get(workers["node_a"].settle.remote(), timeout=600)

        # every worker's rollouts, read together
        found = _wait_for(output, 2 + 2 + 2 + 2 + 3)
        logs = {f"rollouts.{socket.gethostname()}.{pid}.jsonl" for pid in pids.values()}
        assert {p.name for p in output.glob("rollouts*.jsonl")} == logs
        for group, rec in found.items():
            node = "node_b" if group.startswith(("r1b", "r2b")) else "node_a"
            assert rec["log"].split(".")[-2] == str(pids[node]), group
            assert (rec["status"] == "aborted") == group.startswith("r2b"), (group, rec)
        print("errors of node b's episodes while its engine was down:",
              [rec["error"] for group, rec in found.items() if group.startswith("r2b")])
        index = RunIndex(output)
        index.refresh()
        episodes = index.overview()["episodes"]
        assert sorted(e["group_id"] for e in episodes) == sorted(found)
        assert sum(e["status"] == "aborted" for e in episodes) == 3 and index.bad_lines == 0
        assert main([str(output), "--export", str(tmp_path / "run.html")]) == 0

        # exit: the workers outlive the driver (detached, like a stuck worker); every node stops
        # the run's processes and removes its sandboxes; node b's dead engine is reported, not fatal
        ray.shutdown()
        assert _run_containers(clients["node_a"], run_id)
        ended = {r["engine"]: r for r in clean_cluster(run_id, address=cluster["address"], env_vars=import_path,
                                                        grace=5.0).values()}
        assert set(ended) == hosts
        node_a, node_b = ended[engines["node_a"].host], ended[engines["node_b"].host]
        assert node_a["error"] is None and node_a["removed"] >= 1, node_a
        assert node_b["error"] is not None, node_b
        assert set(pids.values()) <= set(node_a["stopped"]) | set(node_b["stopped"])
        assert run_processes(run_id) == []
        assert _run_containers(clients["node_a"], run_id) == []

    # nothing of the two nodes is left: no Ray process of the cluster, no engine, no files, no mounts
    assert processes_with(left["mark"]) == []
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for root in left["roots"]:
        assert not root.exists() and not any(m.startswith(str(root)) for m in mounts)
