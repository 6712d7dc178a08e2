"""Container and pod names from the runtimes' own files, laid out in a temporary
directory the way each runtime writes them on a host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuadmin.probe.config import ProbeConfig, RuntimePaths
from gpuadmin.probe.owners import METADATA_MAX_BYTES, Owner, OwnerResolver, owner_from_cgroup

CID = "4f1c0ab2e3d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1"
CID2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
POD = "0c9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a"
POD_SYSTEMD = POD.replace("-", "_")
IMAGE_ID = "sha256:" + "ab" * 32


@pytest.fixture
def paths(tmp_path: Path) -> RuntimePaths:
    return RuntimePaths(
        docker_root=str(tmp_path / "var/lib/docker"),
        containers_storage_root=str(tmp_path / "var/lib/containers/storage"),
        containerd_state_root=str(tmp_path / "run/containerd"),
        kubernetes_log_root=str(tmp_path / "var/log"),
    )


def write_json(path: str | Path, document: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document))


def docker_container(paths: RuntimePaths, container_id: str, name: str, image: str,
                     labels: dict[str, str] | None = None) -> None:
    """/var/lib/docker/containers/<id>/ as dockerd leaves it (the fields we read, and some we do not)."""
    directory = Path(paths.docker_root) / "containers" / container_id
    write_json(directory / "config.v2.json", {
        "StreamConfig": {}, "State": {"Running": True, "Pid": 4242, "ExitCode": 0},
        "ID": container_id, "Created": "2026-12-02T10:00:00.000000000Z", "Managed": False,
        "Path": "python", "Args": ["train.py"],
        "Config": {"Hostname": container_id[:12], "User": "", "Env": ["PATH=/usr/bin"],
                   "Cmd": ["python", "train.py"], "Image": image, "Labels": labels or {}},
        "Image": IMAGE_ID, "Name": name, "Driver": "overlay2", "RestartCount": 0,
    })
    write_json(directory / "hostconfig.json", {"Runtime": "runc", "DeviceRequests": [{"Driver": "nvidia"}]})


def containerd_bundle(paths: RuntimePaths, namespace: str, container_id: str,
                      annotations: dict[str, str]) -> None:
    """A shim v2 bundle under containerd's state directory: the OCI config.json with annotations."""
    directory = Path(paths.containerd_state_root) / "io.containerd.runtime.v2.task" / namespace / container_id
    write_json(directory / "config.json", {
        "ociVersion": "1.1.0", "process": {"args": ["python", "train.py"], "cwd": "/"},
        "root": {"path": "rootfs"}, "annotations": annotations,
    })
    (directory / "address").write_text("unix:///run/containerd/s/" + "0" * 64)


def storage_containers(paths: RuntimePaths, entries: list[dict[str, object]],
                       driver: str = "overlay") -> None:
    """containers/storage's listing, shared by Podman and CRI-O."""
    write_json(Path(paths.containers_storage_root) / f"{driver}-containers" / "containers.json", entries)


def storage_spec(paths: RuntimePaths, container_id: str, annotations: dict[str, str],
                 driver: str = "overlay") -> None:
    root = Path(paths.containers_storage_root) / f"{driver}-containers" / container_id / "userdata"
    write_json(root / "config.json", {"ociVersion": "1.0.2-dev", "annotations": annotations})


def kubelet_logs(paths: RuntimePaths, *, namespace: str, pod: str, pod_uid: str, container: str,
                 container_id: str) -> None:
    """The kubelet's pod log directory and its /var/log/containers symlink."""
    log_root = Path(paths.kubernetes_log_root)
    pod_dir = log_root / "pods" / f"{namespace}_{pod}_{pod_uid}" / container
    pod_dir.mkdir(parents=True, exist_ok=True)
    (pod_dir / "0.log").write_text("2026-12-02T10:00:00Z stdout F hello\n")
    (log_root / "containers").mkdir(parents=True, exist_ok=True)
    link = log_root / "containers" / f"{pod}_{namespace}_{container}-{container_id}.log"
    link.symlink_to(pod_dir / "0.log")


def resolve(paths: RuntimePaths, cgroup_text: str) -> Owner:
    owner = owner_from_cgroup(cgroup_text)
    assert owner is not None
    return OwnerResolver(paths).with_names(owner)


def test_docker_container_name_and_image(paths: RuntimePaths) -> None:
    docker_container(paths, CID, "/trainer", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime")
    assert resolve(paths, f"0::/system.slice/docker-{CID}.scope\n") == Owner(
        kind="container", runtime="docker", container_id=CID, container_name="trainer",
        image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
    )


def test_a_bare_id_is_looked_up_in_every_runtime(paths: RuntimePaths) -> None:
    containerd_bundle(paths, "default", CID, {"nerdctl/name": "etl-1"})
    assert resolve(paths, f"0::/default/{CID}\n") == Owner(
        kind="container", runtime="containerd", container_id=CID, container_name="etl-1", image=None,
    )


def test_docker_through_containerd_is_docker(paths: RuntimePaths) -> None:
    """Docker runs its containers in containerd's "moby" namespace; only the bundle is there."""
    containerd_bundle(paths, "moby", CID, {})
    assert resolve(paths, f"0::/{CID}\n").runtime == "docker"


def test_kubernetes_names_from_containerd_annotations(paths: RuntimePaths) -> None:
    containerd_bundle(paths, "k8s.io", CID, {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "bert",
        "io.kubernetes.cri.image-name": "registry.lab/ml/bert:7",
        "io.kubernetes.cri.sandbox-id": CID2,
        "io.kubernetes.cri.sandbox-name": "bert-train-0",
        "io.kubernetes.cri.sandbox-namespace": "ml",
        "io.kubernetes.cri.sandbox-uid": POD,
    })
    cgroup = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}.slice/"
              f"cri-containerd-{CID}.scope\n")
    assert resolve(paths, cgroup) == Owner(
        kind="kubernetes_pod", runtime="containerd", pod_uid=POD, qos_class="burstable", namespace="ml",
        pod_name="bert-train-0", container_id=CID, container_name="bert", image="registry.lab/ml/bert:7",
    )


def test_kubernetes_names_from_cri_dockerd_labels(paths: RuntimePaths) -> None:
    docker_container(paths, CID, f"/k8s_bert_bert-train-0_ml_{POD}_0", "registry.lab/ml/bert:7", labels={
        "io.kubernetes.container.name": "bert", "io.kubernetes.pod.name": "bert-train-0",
        "io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.uid": POD,
    })
    owner = resolve(paths, f"11:freezer:/kubepods/burstable/pod{POD}/{CID}\n")
    assert (owner.runtime, owner.namespace, owner.pod_name, owner.container_name, owner.image) == (
        "docker", "ml", "bert-train-0", "bert", "registry.lab/ml/bert:7")


def test_kubernetes_names_from_the_kubelet_logs_when_the_runtime_is_unreadable(paths: RuntimePaths) -> None:
    kubelet_logs(paths, namespace="ml", pod="bert-train-0", pod_uid=POD, container="bert", container_id=CID)
    owner = resolve(paths, f"0::/kubepods/besteffort/pod{POD}/{CID}\n")
    assert (owner.namespace, owner.pod_name, owner.container_name) == ("ml", "bert-train-0", "bert")
    assert owner.image is None


def test_a_pod_without_its_container_log_is_named_from_the_pod_directory(paths: RuntimePaths) -> None:
    # Another container of the same pod has a log; this one has none yet.
    kubelet_logs(paths, namespace="ml", pod="bert-train-0", pod_uid=POD, container="bert", container_id=CID2)
    owner = resolve(paths, f"0::/kubepods/besteffort/pod{POD}/{CID}\n")
    assert (owner.namespace, owner.pod_name, owner.container_name) == ("ml", "bert-train-0", None)


def test_podman_names_from_containers_storage(paths: RuntimePaths) -> None:
    storage_containers(paths, [
        {"id": CID2, "names": ["other"], "image": "ef" * 32, "metadata": "{}"},
        {"id": CID, "names": ["trainer"], "image": "cd" * 32, "layer": "12" * 32,
         "metadata": json.dumps({"image-name": "docker.io/library/python:3.12", "image-id": "cd" * 32,
                                 "name": "trainer", "created-at": 1764669600}),
         "created": "2026-12-02T10:00:00Z", "flags": {"MountLabel": ""}},
    ])
    storage_spec(paths, CID, {"io.container.manager": "libpod", "org.opencontainers.image.stopSignal": "15"})
    assert resolve(paths, f"0::/machine.slice/libpod-{CID}.scope/container\n") == Owner(
        kind="container", runtime="podman", container_id=CID, container_name="trainer",
        image="docker.io/library/python:3.12",
    )


def test_cri_o_names_from_its_spec_annotations(paths: RuntimePaths) -> None:
    storage_containers(paths, [{
        "id": CID, "names": [f"k8s_bert_bert-train-0_ml_{POD}_0"], "image": "cd" * 32,
        "metadata": json.dumps({"pod-name": "bert-train-0", "pod-id": CID2,
                                "image-name": "registry.lab/ml/bert:7"}),
    }])
    storage_spec(paths, CID, {
        "io.kubernetes.cri-o.ContainerType": "container",
        "io.kubernetes.cri-o.ImageName": "registry.lab/ml/bert:7",
        "io.kubernetes.container.name": "bert", "io.kubernetes.pod.name": "bert-train-0",
        "io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.uid": POD,
    })
    cgroup = (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/"
              f"crio-{CID}.scope\n")
    owner = resolve(paths, cgroup)
    assert (owner.runtime, owner.namespace, owner.pod_name, owner.container_name, owner.image) == (
        "cri-o", "ml", "bert-train-0", "bert", "registry.lab/ml/bert:7")


def test_no_metadata_leaves_the_ids(paths: RuntimePaths) -> None:
    assert resolve(paths, f"0::/system.slice/docker-{CID}.scope\n") == Owner(
        kind="container", runtime="docker", container_id=CID)


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"Name": 7, "Config": "x"}', b"\xff\xfe",
                                     b"[" * 100_000, b" " * (METADATA_MAX_BYTES + 1)])
def test_broken_metadata_is_no_names_never_an_error(paths: RuntimePaths, content: bytes) -> None:
    tasks = Path(paths.containerd_state_root) / "io.containerd.runtime.v2.task"
    for path in (Path(paths.docker_root) / "containers" / CID / "config.v2.json",
                 Path(paths.containers_storage_root) / "overlay-containers" / "containers.json",
                 tasks / "k8s.io" / CID / "config.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    owner = resolve(paths, f"0::/kubepods/besteffort/pod{POD}/{CID}\n")
    assert (owner.container_name, owner.image, owner.namespace) == (None, None, None)


def test_a_directory_where_a_file_belongs_is_no_names(paths: RuntimePaths) -> None:
    (Path(paths.docker_root) / "containers" / CID / "config.v2.json").mkdir(parents=True)
    assert resolve(paths, f"0::/docker/{CID}\n").container_name is None


def test_long_names_are_clipped_to_the_schema(paths: RuntimePaths) -> None:
    docker_container(paths, CID, "/" + "n" * 5000, "i" * 5000)
    owner = resolve(paths, f"0::/docker/{CID}\n")
    assert owner.container_name == "n" * 256
    assert owner.image == "i" * 256


def test_each_container_is_read_once_per_snapshot(paths: RuntimePaths) -> None:
    docker_container(paths, CID, "/trainer", "img")
    resolver = OwnerResolver(paths)
    first = resolver.with_names(Owner(kind="container", runtime="docker", container_id=CID))
    os.remove(Path(paths.docker_root) / "containers" / CID / "config.v2.json")
    assert resolver.with_names(Owner(kind="container", runtime="docker", container_id=CID)) == first
    assert OwnerResolver(paths).with_names(Owner(kind="container", runtime="docker", container_id=CID)) \
        .container_name is None


def test_the_paths_come_from_the_environment() -> None:
    config = ProbeConfig.from_env({
        "GPUADMIN_DOCKER_ROOT": "/data/docker", "GPUADMIN_CONTAINERS_STORAGE_ROOT": "/data/storage",
        "GPUADMIN_CONTAINERD_STATE_ROOT": "/host/run/containerd",
        "GPUADMIN_KUBERNETES_LOG_ROOT": "/host/var/log",
    }, host_name="gpu01")
    assert config.runtime_paths == RuntimePaths("/data/docker", "/data/storage", "/host/run/containerd",
                                                "/host/var/log")
    assert ProbeConfig.from_env({}, host_name="gpu01").runtime_paths == RuntimePaths()
    assert RuntimePaths().docker_root == "/var/lib/docker"


def test_a_fifo_where_a_file_belongs_does_not_hang_the_probe(paths: RuntimePaths) -> None:
    """A user who can write to a store (rootless Podman's, in a home directory) must not stall the agent."""
    listing = Path(paths.containers_storage_root) / "overlay-containers" / "containers.json"
    listing.parent.mkdir(parents=True)
    os.mkfifo(listing)
    assert resolve(paths, f"0::/machine.slice/libpod-{CID}.scope\n").container_name is None
