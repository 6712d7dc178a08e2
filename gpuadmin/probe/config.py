"""What one probe run reads, from the command line or the agent's environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GPU_BACKENDS = ("auto", "nvml", "simulated", "none")
DEFAULT_DEVICE_GLOB = "/dev/nvidia*"
DEFAULT_CMDLINE_MAX_BYTES = 4096
# The schema allows 8192 characters per argument; a cap in bytes at most that keeps every argument valid.
CMDLINE_MAX_BYTES_LIMIT = 8192
# The schema's host-name rule (snapshot.schema.json, host.name): a DNS-ish label.
HOST_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


# Where each container runtime keeps its containers' metadata: setting -> (variable, stock default).
RUNTIME_PATH_VARIABLES = {
    "docker_root": ("GPUADMIN_DOCKER_ROOT", "/var/lib/docker"),
    # Podman's and CRI-O's shared store (containers/storage): <root>/<driver>-containers/.
    "containers_storage_root": ("GPUADMIN_CONTAINERS_STORAGE_ROOT", "/var/lib/containers/storage"),
    # containerd's state directory: <root>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json.
    "containerd_state_root": ("GPUADMIN_CONTAINERD_STATE_ROOT", "/run/containerd"),
    # The kubelet's logs: <root>/pods/<ns>_<pod>_<uid>/ and <root>/containers/<pod>_<ns>_<ctr>-<id>.log.
    "kubernetes_log_root": ("GPUADMIN_KUBERNETES_LOG_ROOT", "/var/log"),
}


@dataclass(frozen=True, slots=True)
class RuntimePaths:
    """Where the probe looks up a container's name and image (gpuadmin/probe/owners.py).
    A directory that is missing or unreadable only means fewer names, never an error."""

    docker_root: str = RUNTIME_PATH_VARIABLES["docker_root"][1]
    containers_storage_root: str = RUNTIME_PATH_VARIABLES["containers_storage_root"][1]
    containerd_state_root: str = RUNTIME_PATH_VARIABLES["containerd_state_root"][1]
    kubernetes_log_root: str = RUNTIME_PATH_VARIABLES["kubernetes_log_root"][1]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RuntimePaths:
        return cls(**{name: env.get(variable) or default
                      for name, (variable, default) in RUNTIME_PATH_VARIABLES.items()})


class ProbeConfigError(ValueError):
    """A setting the probe cannot work with; the message names the setting."""


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    gpu_backend: str = "auto"
    simulated_gpus_path: str | None = None
    device_glob: str = DEFAULT_DEVICE_GLOB
    include_all: bool = False
    host_name: str = ""
    cmdline_max_bytes: int = DEFAULT_CMDLINE_MAX_BYTES
    runtime_paths: RuntimePaths = field(default_factory=RuntimePaths)

    def __post_init__(self) -> None:
        if self.gpu_backend not in GPU_BACKENDS:
            raise ProbeConfigError(
                f"GPU backend must be one of {', '.join(GPU_BACKENDS)}; got {self.gpu_backend!r}"
            )
        if not self.host_name:
            object.__setattr__(self, "host_name", os.uname().nodename)
        if not HOST_NAME_PATTERN.match(self.host_name):
            raise ProbeConfigError(
                f"host name {self.host_name!r} is not usable: letters, digits, '.', '_' and '-' only, "
                "starting with a letter or digit (set GPUADMIN_HOST_NAME)"
            )
        if not self.device_glob:
            raise ProbeConfigError("device glob must not be empty")
        if not 1 <= self.cmdline_max_bytes <= CMDLINE_MAX_BYTES_LIMIT:
            raise ProbeConfigError(
                f"cmdline_max_bytes must be 1..{CMDLINE_MAX_BYTES_LIMIT}; got {self.cmdline_max_bytes}"
            )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> ProbeConfig:
        """Defaults from GPUADMIN_* variables; keyword arguments that are not None win."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {
            "gpu_backend": env.get("GPUADMIN_GPU_BACKEND") or "auto",
            "simulated_gpus_path": env.get("GPUADMIN_SIMULATED_GPUS") or None,
            "device_glob": env.get("GPUADMIN_DEVICE_GLOB") or DEFAULT_DEVICE_GLOB,
            "host_name": env.get("GPUADMIN_HOST_NAME") or "",
            "runtime_paths": RuntimePaths.from_env(env),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
