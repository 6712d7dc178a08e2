"""Whose is a process: a Slurm job, a container, a Kubernetes pod, a login
session or a systemd unit.

Two steps. `owner_from_cgroup` is a pure function of the text of
/proc/<pid>/cgroup: the cgroup path names the job, container or unit the
process was placed in, whatever the process calls itself. `OwnerResolver`
then adds what the runtimes' own files say (container name, image, pod
namespace and name) where the agent can read them, and falls back to a
`slurmstepd` ancestor when Slurm puts no cgroup of its own around a job.

Layouts recognised (docs/snapshot.md, `owner`):
- Slurm, cgroup v1: ``/slurm[_<node>]/uid_<u>/job_<j>/step_<s>/task_<t>``;
  cgroup v2: ``/system.slice/[<node>_]slurmstepd.scope/job_<j>/step_<s>/user/task_<t>``.
- Docker: ``/docker/<id>``, ``/system.slice/docker-<id>.scope``; Podman:
  ``libpod-<id>.scope[/container]``, ``/libpod_parent/libpod-<id>``; containerd:
  ``cri-containerd-<id>.scope``, ``nerdctl-<id>.scope``, ``/<namespace>/<id>``;
  CRI-O: ``crio-<id>.scope``; and the ``<slice>:<prefix>:<id>`` directory that a
  cgroup v1 host shows when the runtime and the kubelet disagree on drivers.
- Kubernetes: ``kubepods[/burstable|/besteffort]/pod<uid>/<id>`` (cgroupfs
  driver) and ``kubepods[-burstable|-besteffort]-pod<uid_with_underscores>.slice/<prefix>-<id>.scope``
  (systemd driver), kind's ``kubelet-kubepods…`` too.
- systemd: ``session-<n>.scope`` (a login), units under ``user@<uid>.service``
  (the user's own manager: desktop apps, ``systemd-run --user``), and any other
  ``.service``/``.scope`` (a system service).

Below ``user@<uid>.service`` systemd delegates the subtree to the user, who can
make any directory there (``…/user@1000.service/x/slurm/job_4242``): inside it
only the user's unit is read (kind ``user_service``, that uid), never a Slurm
job, container, pod, session or other uid. A rootless Podman container is
therefore shown as its user's ``libpod-<id>.scope`` unit, not as a container.
A workload found above it (a user manager inside a container) stays the owner.

Anything else is no owner. A container's conmon/shim monitor scope
(``libpod-conmon-<id>.scope``, ``crio-conmon-<id>.scope``) is deliberately not
the container: it is the runtime's process, and a "kill the container's
processes" must not include it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache

from gpuadmin.probe.config import RuntimePaths
from gpuadmin.probe.procfs import StatFields, read_cmdline_bytes

# The order is the schema's enum (snapshot.schema.json, $defs/owner.kind).
SLURM_JOB = "slurm_job"
CONTAINER = "container"
KUBERNETES_POD = "kubernetes_pod"
LOGIN_SESSION = "login_session"
USER_SERVICE = "user_service"
SYSTEM_SERVICE = "system_service"
OWNER_KINDS = (SLURM_JOB, CONTAINER, KUBERNETES_POD, LOGIN_SESSION, USER_SERVICE, SYSTEM_SERVICE)
# A job, container or pod is what an admin acts on; a systemd unit only says
# where a process was started, so it is reported only when nothing better is found.
WORKLOAD_KINDS = (SLURM_JOB, CONTAINER, KUBERNETES_POD)
RUNTIMES = ("docker", "podman", "containerd", "cri-o")

# The fields each kind's document carries (always all of them; null = not known).
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    SLURM_JOB: ("job_id", "step", "uid"),
    CONTAINER: ("runtime", "container_id", "container_name", "image"),
    KUBERNETES_POD: ("runtime", "pod_uid", "qos_class", "namespace", "pod_name",
                     "container_id", "container_name", "image"),
    LOGIN_SESSION: ("session_id", "uid", "unit"),
    USER_SERVICE: ("unit", "uid"),
    SYSTEM_SERVICE: ("unit",),
}
# Names come from files that users influence (container names, labels): the schema's cap.
TEXT_MAX_CHARS = 256
# A runtime's metadata file bigger than this is not one we should parse on every probe.
METADATA_MAX_BYTES = 4 * 1024 * 1024

_HEX_ID = r"[0-9a-f]{64}"
# One path component naming a container: <prefix>-<id>[.scope], or the bare id.
_CONTAINER_COMPONENT = re.compile(
    rf"^(?:(docker|libpod|cri-containerd|crio|nerdctl)-)?({_HEX_ID})(?:\.scope)?$"
)
_PREFIX_RUNTIME = {
    "docker": "docker",
    "libpod": "podman",
    "cri-containerd": "containerd",
    "nerdctl": "containerd",
    "crio": "cri-o",
}
# The component above a bare id names the runtime in cgroupfs layouts.
_PARENT_RUNTIME = {"docker": "docker", "libpod_parent": "podman"}
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# Static pods' "UIDs" are 32 hex digits (a hash of the manifest), not UUIDs.
_POD_COMPONENT = re.compile(rf"^(?:.*-)?pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
_QOS_CLASSES = ("burstable", "besteffort")
_SLURM_ROOT = re.compile(r"^(?:slurm(?:_.+)?|(?:.+_)?slurmstepd\.scope)$")
_SLURM_UID = re.compile(r"^uid_(\d+)$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
_SLURM_STEP = re.compile(r"^step_(\w+)$")
_SESSION = re.compile(r"^session-([A-Za-z0-9]+)\.scope$")
_USER_SLICE = re.compile(r"^user-(\d+)\.slice$")
_USER_MANAGER = re.compile(r"^user@(\d+)\.service$")
# slurmstepd rewrites its title to "slurmstepd: [<job>.<step>]" (hetjob components: "<step>+<n>").
_SLURMSTEPD_TITLE = re.compile(r"^slurmstepd: \[(\d+)\.([\w+]+)\]")
SLURMSTEPD = "slurmstepd"


@dataclass(frozen=True, slots=True)
class Owner:
    """What a process belongs to. Which fields apply depends on ``kind`` (KIND_FIELDS)."""

    kind: str
    job_id: str | None = None
    step: str | None = None
    uid: int | None = None
    runtime: str | None = None
    container_id: str | None = None
    container_name: str | None = None
    image: str | None = None
    pod_uid: str | None = None
    qos_class: str | None = None
    namespace: str | None = None
    pod_name: str | None = None
    session_id: str | None = None
    unit: str | None = None

    def as_document(self) -> dict[str, object]:
        document: dict[str, object] = {"kind": self.kind}
        for name in KIND_FIELDS[self.kind]:
            document[name] = getattr(self, name)
        return document

    def replace(self, **changes: object) -> Owner:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Owner(**values)


# --- the pure part: /proc/<pid>/cgroup -> owner ----------------------------------------


@lru_cache(maxsize=512)  # bounded: users can make deep cgroups of their own under user@.service
def owner_from_cgroup(text: str) -> Owner | None:
    """The owner named by /proc/<pid>/cgroup text (v1, v2 or hybrid), None when none is.

    Cached: a job's workers, a session's shells and a container's processes
    share one text, and the agent probes the same cgroups again every interval.

    A job, container or pod found on any line wins over a systemd unit (on a v1
    host docker's cgroupfs driver moves a container's controllers while the
    name=systemd line still shows the login session it was started from). For
    units, the systemd-managed line (``0::`` or ``name=systemd``) is believed first:
    controller lines of v1 hosts can lag behind it.
    """
    systemd_first: list[str] = []
    others: list[str] = []
    for line in text.splitlines():
        _hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2):
            continue
        (systemd_first if controllers in ("", "name=systemd") else others).append(path)
    best: Owner | None = None
    for path in systemd_first + others:
        found = owner_from_path(path)
        if found is None:
            continue
        if found.kind in WORKLOAD_KINDS:
            return found
        if best is None:
            best = found
    return best


def owner_from_path(path: str) -> Owner | None:
    """The owner named by one cgroup path; the innermost job, container or pod wins
    (a Slurm job inside a pod, a container inside a container)."""
    reader = _PathReader()
    parts: list[str] = []
    for part in path.split("/"):
        if part.count(":") == 2:
            # systemd's "slice:prefix:name" cgroupsPath written literally as one directory by a
            # runtime on the cgroupfs driver while the kubelet uses systemd's (seen on v1 hosts).
            slice_name, prefix, name = part.split(":")
            parts += [slice_name, f"{prefix}-{name}.scope"]
        elif part:
            parts.append(part)
    for index, part in enumerate(parts):
        if reader.user_manager:
            # Below user@<uid>.service the user makes the directories (systemd delegates the
            # subtree): a "job_4242", a container id or a pod there is whatever the user wrote.
            reader.delegated(part)
            continue
        parent = parts[index - 1] if index else ""
        # Each reader returns True when the component was its own; the first taker wins.
        _ = (reader.kubernetes(part) or reader.container(part, parent)
             or reader.slurm(part) or reader.systemd(part))
    return reader.owner()


class _PathReader:
    """What the components of one cgroup path said so far, outermost first."""

    def __init__(self) -> None:
        self.workload: Owner | None = None
        self.in_kubepods = False
        self.qos_class: str | None = None
        self.pod_uid: str | None = None
        self.in_slurm = False
        self.slurm_uid: int | None = None
        self.unit: str | None = None
        self.session_id: str | None = None
        self.user_uid: int | None = None
        self.user_manager = False

    def kubernetes(self, part: str) -> bool:
        if part.startswith(("kubepods", "kubelet-kubepods")):
            self.in_kubepods = True
            self.qos_class = next((q for q in _QOS_CLASSES if f"-{q}" in part), self.qos_class)
        elif self.in_kubepods and part in _QOS_CLASSES:
            self.qos_class = part
        pod = _POD_COMPONENT.match(part) if self.in_kubepods else None
        if pod is None:
            return False
        # The systemd driver spells the UID's dashes as underscores.
        self.pod_uid = pod.group(1).replace("_", "-")
        self.workload = Owner(kind=KUBERNETES_POD, pod_uid=self.pod_uid,
                              qos_class=self.qos_class or "guaranteed")
        return True

    def container(self, part: str, parent: str) -> bool:
        found = _CONTAINER_COMPONENT.match(part)
        if found is None:
            return False
        prefix, container_id = found.groups()
        runtime = _PREFIX_RUNTIME[prefix] if prefix else _PARENT_RUNTIME.get(parent)
        if self.pod_uid is not None:
            self.workload = Owner(kind=KUBERNETES_POD, runtime=runtime, pod_uid=self.pod_uid,
                                  qos_class=self.qos_class or "guaranteed", container_id=container_id)
        else:
            self.workload = Owner(kind=CONTAINER, runtime=runtime, container_id=container_id)
        return True

    def slurm(self, part: str) -> bool:
        if _SLURM_ROOT.match(part):
            self.in_slurm, self.slurm_uid = True, None
            return True
        if not self.in_slurm:
            return False
        if uid := _SLURM_UID.match(part):
            self.slurm_uid = int(uid.group(1))
        elif job := _SLURM_JOB.match(part):
            self.workload = Owner(kind=SLURM_JOB, job_id=job.group(1), uid=self.slurm_uid)
        elif (step := _SLURM_STEP.match(part)) and self.workload and self.workload.kind == SLURM_JOB:
            self.workload = self.workload.replace(step=step.group(1))
        return True

    def systemd(self, part: str) -> bool:
        if user := _USER_SLICE.match(part):
            self.user_uid = int(user.group(1))
        elif manager := _USER_MANAGER.match(part):
            # Units below are the user's own; the login session above is no longer the owner.
            self.user_uid, self.user_manager = int(manager.group(1)), True
            self.unit = self.session_id = None
        elif part.endswith((".service", ".scope")):
            self.unit = part
            if session := _SESSION.match(part):
                self.session_id = session.group(1)
        else:
            return False
        return True

    def delegated(self, part: str) -> None:
        """A component inside the user's own manager: only its unit name is read, never a job,
        container, pod, session or another uid (``user@0.service`` made by uid 1000 is still 1000's)."""
        if part.endswith((".service", ".scope")):
            self.unit = part

    def owner(self) -> Owner | None:
        if self.workload is not None:
            return self.workload
        if self.unit is None:
            return None
        if self.user_manager:
            return Owner(kind=USER_SERVICE, unit=self.unit, uid=self.user_uid)
        if self.session_id is not None:
            return Owner(kind=LOGIN_SESSION, session_id=self.session_id, uid=self.user_uid, unit=self.unit)
        return Owner(kind=SYSTEM_SERVICE, unit=self.unit)


def slurm_job_from_title(title: str) -> Owner | None:
    """A Slurm job from a slurmstepd's rewritten command line, ``slurmstepd: [1234.0]``."""
    found = _SLURMSTEPD_TITLE.match(title)
    return Owner(kind=SLURM_JOB, job_id=found.group(1), step=found.group(2)) if found else None


def slurmstepd_ancestor(pid: int, stats: Mapping[int, StatFields]) -> int | None:
    """The nearest ancestor named slurmstepd (every task of a job descends from one)."""
    seen: set[int] = set()
    parent = stats[pid].ppid if pid in stats else 0
    while parent in stats and parent not in seen:
        seen.add(parent)
        if stats[parent].comm == SLURMSTEPD:
            return parent
        parent = stats[parent].ppid
    return None


# --- the runtimes' files ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerFacts:
    """What one runtime's files say about a container id."""

    runtime: str
    container_name: str | None = None
    image: str | None = None
    namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None


def _text(value: object) -> str | None:
    """A metadata string as the snapshot may carry it: clipped, None unless a non-empty string."""
    if not isinstance(value, str) or not value:
        return None
    return value[:TEXT_MAX_CHARS]


def _read_json(path: str) -> object:
    """The parsed file, or None when it is missing, unreadable, too big or not JSON."""
    try:
        # Non-blocking, and regular files only: a FIFO planted in a store a user can
        # write to (rootless Podman's, in a home directory) must not hang the agent.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(METADATA_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > METADATA_MAX_BYTES:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _mapping(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def docker_facts(paths: RuntimePaths, container_id: str) -> ContainerFacts | None:
    """From <docker_root>/containers/<id>/config.v2.json (dockerd writes it for every container)."""
    path = os.path.join(paths.docker_root, "containers", container_id, "config.v2.json")
    config = _mapping(_read_json(path))
    if not config:
        return None
    inner = _mapping(config.get("Config"))
    labels = _mapping(inner.get("Labels"))
    raw_name = config.get("Name")
    name = _text(raw_name.lstrip("/") if isinstance(raw_name, str) else None)
    return ContainerFacts(
        runtime="docker",
        # Docker keeps its names with a leading "/"; dockershim / cri-dockerd label the
        # Kubernetes container name, which says more than their generated k8s_... name.
        container_name=_text(labels.get("io.kubernetes.container.name")) or name,
        image=_text(inner.get("Image")),
        namespace=_text(labels.get("io.kubernetes.pod.namespace")),
        pod_name=_text(labels.get("io.kubernetes.pod.name")),
        pod_uid=_text(labels.get("io.kubernetes.pod.uid")),
    )


def containerd_facts(paths: RuntimePaths, container_id: str) -> ContainerFacts | None:
    """From the OCI bundle containerd's shim keeps in its state directory:
    <root>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json. The CRI
    plugin annotates it with the pod's and container's names; nerdctl with its own."""
    tasks = os.path.join(paths.containerd_state_root, "io.containerd.runtime.v2.task")
    try:
        namespaces = sorted(os.listdir(tasks))
    except OSError:
        return None
    for namespace in namespaces:
        spec = _mapping(_read_json(os.path.join(tasks, namespace, container_id, "config.json")))
        if not spec:
            continue
        notes = _mapping(spec.get("annotations"))
        # Docker runs its containers in containerd's "moby" namespace: the container is docker's.
        runtime = "docker" if namespace == "moby" else "containerd"
        return ContainerFacts(
            runtime=runtime,
            container_name=_text(notes.get("io.kubernetes.cri.container-name"))
            or _text(notes.get("nerdctl/name")),
            image=_text(notes.get("io.kubernetes.cri.image-name")),
            namespace=_text(notes.get("io.kubernetes.cri.sandbox-namespace")),
            pod_name=_text(notes.get("io.kubernetes.cri.sandbox-name")),
            pod_uid=_text(notes.get("io.kubernetes.cri.sandbox-uid")),
        )
    return None


class ContainersStorage:
    """Podman's and CRI-O's store: <root>/<driver>-containers/containers.json lists every
    container (names, and libpod's metadata with the image name); CRI-O's
    <id>/userdata/config.json carries the pod's names as annotations."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._listing: dict[str, dict[str, object]] | None = None

    def _containers(self) -> dict[str, dict[str, object]]:
        if self._listing is None:
            self._listing = {}
            try:
                drivers = sorted(d for d in os.listdir(self.root) if d.endswith("-containers"))
            except OSError:
                drivers = []
            for driver in drivers:
                listed = _read_json(os.path.join(self.root, driver, "containers.json"))
                for entry in listed if isinstance(listed, list) else ():
                    if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                        self._listing[entry["id"]] = {**entry, "_driver": driver}
        return self._listing

    def facts(self, container_id: str) -> ContainerFacts | None:
        entry = self._containers().get(container_id)
        if entry is None:
            return None
        driver = str(entry["_driver"])
        spec = _mapping(_read_json(os.path.join(self.root, driver, container_id, "userdata", "config.json")))
        notes = _mapping(spec.get("annotations"))
        if notes.get("io.kubernetes.cri-o.ContainerType") or notes.get("io.kubernetes.pod.name"):
            return ContainerFacts(
                runtime="cri-o",
                container_name=_text(notes.get("io.kubernetes.container.name")),
                image=_text(notes.get("io.kubernetes.cri-o.ImageName")),
                namespace=_text(notes.get("io.kubernetes.pod.namespace")),
                pod_name=_text(notes.get("io.kubernetes.pod.name")),
                pod_uid=_text(notes.get("io.kubernetes.pod.uid")),
            )
        names = entry.get("names")
        metadata = entry.get("metadata")
        try:
            libpod = _mapping(json.loads(metadata)) if isinstance(metadata, str) else {}
        except ValueError:
            libpod = {}
        first_name = names[0] if isinstance(names, list) and names else None
        return ContainerFacts(
            runtime="podman",
            container_name=_text(first_name) or _text(libpod.get("name")),
            image=_text(libpod.get("image-name")),
        )


class KubeletLogs:
    """The kubelet names its log paths after the pod and container, which makes them
    the one place that maps ids to names on any CRI runtime, readable without the API:
    <root>/containers/<pod>_<namespace>_<container>-<id>.log and <root>/pods/<namespace>_<pod>_<uid>/."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._by_container: dict[str, tuple[str, str, str]] | None = None
        self._by_pod: dict[str, tuple[str, str]] | None = None

    def container(self, container_id: str) -> tuple[str, str, str] | None:
        """(namespace, pod name, container name) of a container id."""
        if self._by_container is None:
            self._by_container = {}
            for name in _list(os.path.join(self.root, "containers")):
                stem, dash, found_id = name.removesuffix(".log").rpartition("-")
                parts = stem.split("_")
                if dash and len(parts) == 3 and re.fullmatch(_HEX_ID, found_id):
                    pod, namespace, container = parts
                    self._by_container[found_id] = (namespace, pod, container)
        return self._by_container.get(container_id)

    def pod(self, pod_uid: str) -> tuple[str, str] | None:
        """(namespace, pod name) of a pod UID."""
        if self._by_pod is None:
            self._by_pod = {}
            for name in _list(os.path.join(self.root, "pods")):
                parts = name.split("_")
                if len(parts) == 3:
                    namespace, pod, uid = parts
                    self._by_pod[uid] = (namespace, pod)
        return self._by_pod.get(pod_uid)


def _list(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


@dataclass
class OwnerResolver:
    """Owners for one snapshot: reads /proc/<pid>/cgroup of the processes it is asked
    about, and each runtime's files once per container (a job's many workers share
    one container or one slurmstepd)."""

    paths: RuntimePaths = field(default_factory=RuntimePaths)
    _facts: dict[str, ContainerFacts | None] = field(default_factory=dict)
    _slurmstepd_jobs: dict[int, Owner | None] = field(default_factory=dict)
    _storage: ContainersStorage | None = None
    _kubelet: KubeletLogs | None = None

    def owner_of(self, pid: int, stats: Mapping[int, StatFields]) -> Owner | None:
        owner = owner_from_cgroup(read_cgroup_text(pid))
        if owner is None or owner.kind not in WORKLOAD_KINDS:
            # proctrack/linuxproc and hosts without cgroups leave a job in slurmd's unit or nowhere.
            stepd = slurmstepd_ancestor(pid, stats)
            if stepd is not None and (job := self._slurmstepd_job(stepd)) is not None:
                return job
        if owner is not None and owner.container_id is not None:
            owner = self.with_names(owner)
        return owner

    def _slurmstepd_job(self, pid: int) -> Owner | None:
        if pid not in self._slurmstepd_jobs:
            raw = read_cmdline_bytes(pid) or b""
            self._slurmstepd_jobs[pid] = slurm_job_from_title(raw.split(b"\0")[0].decode("utf-8", "replace"))
        return self._slurmstepd_jobs[pid]

    def container_facts(self, container_id: str, runtime: str | None) -> ContainerFacts | None:
        if container_id not in self._facts:
            self._facts[container_id] = self._look_up(container_id, runtime)
        return self._facts[container_id]

    def _look_up(self, container_id: str, runtime: str | None) -> ContainerFacts | None:
        if self._storage is None:
            self._storage = ContainersStorage(self.paths.containers_storage_root)
        lookups: list[Callable[[], ContainerFacts | None]] = []
        if runtime in (None, "docker"):
            lookups.append(lambda: docker_facts(self.paths, container_id))
        if runtime in (None, "containerd", "docker"):
            lookups.append(lambda: containerd_facts(self.paths, container_id))
        if runtime in (None, "podman", "cri-o"):
            lookups.append(lambda: self._storage.facts(container_id) if self._storage else None)
        for lookup in lookups:
            if (found := lookup()) is not None:
                return found
        return None

    def with_names(self, owner: Owner) -> Owner:
        """The owner with its container's and pod's names, where the runtimes' files have them."""
        if owner.container_id is None:
            return owner
        facts = self.container_facts(owner.container_id, owner.runtime)
        changes: dict[str, object] = {}
        if facts is not None:
            changes.update(runtime=owner.runtime or facts.runtime, container_name=facts.container_name,
                           image=facts.image)
        if owner.kind == KUBERNETES_POD:
            namespace = facts.namespace if facts else None
            pod_name = facts.pod_name if facts else None
            container_name = facts.container_name if facts else None
            if namespace is None or pod_name is None or container_name is None:
                if self._kubelet is None:
                    self._kubelet = KubeletLogs(self.paths.kubernetes_log_root)
                logged = self._kubelet.container(owner.container_id)
                if logged is not None:
                    namespace, pod_name, container_name = (
                        namespace or logged[0], pod_name or logged[1], container_name or logged[2]
                    )
                elif owner.pod_uid and (pod := self._kubelet.pod(owner.pod_uid)) is not None:
                    namespace, pod_name = namespace or pod[0], pod_name or pod[1]
            changes.update(namespace=_text(namespace), pod_name=_text(pod_name),
                           container_name=_text(container_name))
        return owner.replace(**changes) if changes else owner


def read_cgroup_text(pid: int) -> str:
    """/proc/<pid>/cgroup, "" when the process is gone or the file unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""

