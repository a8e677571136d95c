"""veRL on a machine without an accelerator: a ``cpu`` platform and veRL's FSDP engines for it.

:class:`PlatformCPU` is registered with veRL 0.9.1's
``verl.plugin.platform.PlatformRegistry`` as ``cpu``: device ``cpu``, gloo
process groups, no IPC, profiling and allocator calls as no-ops. It is used
only when asked for by name, ``VERL_PLATFORM=cpu`` (which the launcher sets in
every process of a CPU run): it never calls itself available to veRL's
detection, so other veRL programs on the host, and a GPU cluster whose driver
or head node has no accelerator, keep veRL's own choice.

veRL's FSDP engines (``FSDPEngineWithLMHead``, ``FSDPEngineWithValueHead``)
are registered in veRL's ``EngineRegistry`` for ``cuda`` and ``npu`` only;
importing this module registers them under device ``cpu`` too, with one
change for the reference model (see :class:`_HostMemoryFSDP`).

Ray scheduling: veRL's resource pools ask Ray for one accelerator per
worker and count the cluster's accelerators under the names ``GPU`` or
``NPU`` only (``ResourcePoolManager._check_resource_available`` in
``verl/single_controller/ray/base.py``). The CPU platform therefore names
Ray's logical ``GPU`` resource as its device slot, and
:mod:`train.verl_backend.launch` starts the local Ray cluster with as many
logical slots as trainer processes (``ray.init(num_gpus=n)``). Ray's
resources are logical counters: nothing runs on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import types
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM = "cpu"


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda``-style calls veRL makes on its device module.

    Memory statistics are 0, cache and seeding calls act on the CPU (``torch.manual_seed``),
    everything else falls through to ``torch.cpu``.
    """

    def __init__(self) -> None:
        super().__init__("nextstate_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def memory_allocated(*_: Any, **__: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(*_: Any, **__: Any) -> tuple[int, int]:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * size
        return free, pages * size

    @staticmethod
    def reset_peak_memory_stats(*_: Any, **__: Any) -> None:
        return None

    set_per_process_memory_fraction = ipc_collect = reset_peak_memory_stats

    @staticmethod
    def get_device_name(*_: Any, **__: Any) -> str:
        return "CPU"

    @staticmethod
    def get_rng_state(*_: Any, **__: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *_: Any, **__: Any) -> None:
        torch.set_rng_state(state)


def accelerator_present() -> bool:
    """Whether this host has a CUDA, ROCm or Ascend device (or an ``nvidia-smi``)."""
    if torch.cuda.is_available() or torch.version.hip is not None or hasattr(torch, "npu"):
        return True
    return shutil.which("nvidia-smi") is not None or os.path.exists("/usr/bin/nvidia-smi")


class PlatformCPU(PlatformBase):
    """veRL's platform interface on host CPUs (one process = one device slot)."""

    _module = _CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """Never detected: only ``VERL_PLATFORM=cpu`` selects this platform (see the module docstring)."""
        return False

    def current_device(self) -> Any:
        """``"cpu"``: veRL passes this to ``Tensor.to`` and ``torch.device``."""
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "NEXTSTATE_VISIBLE_CPUS"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        """Ray's logical ``GPU`` counter (see the module docstring)."""
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


PlatformRegistry.register(platform=PLATFORM)(PlatformCPU)   # before the imports below ask for the platform

from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead  # noqa: E402


class _HostMemoryFSDP:
    """veRL's FSDP engine with forward-only (reference) parameters left where they are.

    veRL wraps a forward-only engine with host offloading -- FSDP2
    ``CPUOffloadPolicy(pin_memory=True)`` or FSDP1 ``CPUOffload`` with
    ``sync_module_states`` (``verl/workers/engine/fsdp/transformer_impl.py``,
    lines 432-462) -- and both need an accelerator (pinned memory, a GPU to
    sync from). On the ``cpu`` platform the parameters already live in host
    memory, so the module is wrapped as a trainable engine's is.
    """

    def _build_fsdp_module(self, module: Any) -> Any:
        config = self.engine_config
        if not config.forward_only:
            return super()._build_fsdp_module(module)
        config.forward_only = False
        try:
            return super()._build_fsdp_module(module)
        finally:
            config.forward_only = True


class CPUFSDPEngineWithLMHead(_HostMemoryFSDP, FSDPEngineWithLMHead):
    """The language-model FSDP engine on the ``cpu`` platform."""


class CPUFSDPEngineWithValueHead(_HostMemoryFSDP, FSDPEngineWithValueHead):
    """The value-model FSDP engine on the ``cpu`` platform."""


for _model_type, _cls in (("language_model", CPUFSDPEngineWithLMHead), ("value_model", CPUFSDPEngineWithValueHead)):
    EngineRegistry.register(model_type=_model_type, backend=["fsdp", "fsdp2"], device=PLATFORM)(_cls)
