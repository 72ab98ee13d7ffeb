"""deploy/kuberay/, checked offline: what can be checked without a Kubernetes cluster.

Schemas. No package on the registries this project installs from ships KubeRay's CRDs
(ray.io_rayclusters.yaml, ray.io_rayjobs.yaml) or their OpenAPI schemas: KubeRay's Python client
is not published there (codeflare-sdk vendors it for that reason, without the CRDs), and its Helm
chart is not a Python package. So the RayCluster and RayJob are NOT validated against KubeRay's
own schemas here, and no copy of them is kept in this repository. What is checked instead:

- the PersistentVolumeClaim, the ConfigMap and every pod template of both manifests, strictly, with
  kubernetes-validate's schemas of Kubernetes itself (a pod template is what KubeRay passes on to
  Kubernetes unchanged, apart from what the operator adds);
- the RayCluster as Ray 2.60 itself reads one: the KubeRay autoscaler's own conversion
  (`ray.autoscaler._private.kuberay.autoscaling_config`) turns each group into the resources Ray
  will see (CPUs, GPUs, custom resources parsed from rayStartParams) and runs the launcher's
  validate_config on the result;
- the entrypoint, run through the chain of shells it meets on a cluster (KubeRay's submitter bash
  line, Ray 2.60's own `ray job submit` command with a stand-in client, the job supervisor's
  /bin/sh) with a stand-in `python`, both ways (a new run, then a resume), and its flags parsed by
  the real `ksearch` command line into the run's config;
- what must agree with the code: the Ray version (the one installed, which cluster.yaml pins), the
  image tag and the Dockerfile's arguments (the project's version, Python within requires-python),
  the build resource the config names and the build group declares, the evaluator count and the
  GPU group's GPUs, the shared volume's mount and the run directory, token authentication.

Each invariant is also shown to fire on a broken copy, so none passes vacuously.

The kustomize variants (base/, one-gpu/, eight-gpu/, each with its values.yaml) are rendered by
`kubectl kustomize`, the kustomize that `kubectl apply -k` runs, and the rendered RayJob, claim and
ConfigMap go through the same checks; a copy of the tree with every value changed shows that each
value reaches every place that needs it. Without kubectl those tests skip (fail in CI).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import ray
import yaml
from click.testing import CliRunner as ClickRunner
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _HEAD_GROUP_NAME,
    _derive_autoscaling_config_from_ray_cr,
)
from ray.dashboard.modules.job import cli as ray_job_cli
from typer.testing import CliRunner

import ksearch_ray
from ksearch_ray import cli
from ksearch_ray.config import RunConfig

REPO = Path(__file__).resolve().parent.parent
KUBERAY = REPO / "deploy" / "kuberay"
# The oldest Kubernetes minor still widely run (managed clusters' extended support) and the newest
# kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
GPU_PRODUCTS = {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"}  # GPU Feature Discovery's names for them

Doc = dict[str, Any]


@functools.cache
def _parsed(name: str) -> Doc:
    return yaml.load((KUBERAY / name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load(name: str) -> Doc:
    return copy.deepcopy(_parsed(name))  # a copy a test may break


@pytest.fixture
def m() -> Manifests:
    return Manifests.load()


class Manifests:
    """The files of deploy/kuberay/, or a variant as kustomize renders it, parsed; tests break copies of them.

    `gpu_products`: the GPU Feature Discovery products the GPU pods must be held to; None where any
    required node label will do (the one-GPU variant takes whatever GPU node the user names)."""

    def __init__(self, cluster: Doc | None, job: Doc, pvc: Doc, config_map: Doc, dockerfile: str, *,
                 texts: dict[str, str], gpu_products: set[str] | None = GPU_PRODUCTS) -> None:
        self.cluster, self.job, self.pvc, self.config_map, self.dockerfile = cluster, job, pvc, config_map, dockerfile
        self.texts, self.gpu_products = texts, gpu_products

    @classmethod
    def load(cls) -> Manifests:
        return cls(load("raycluster.yaml"), load("base/rayjob.yaml"), load("base/pvc.yaml"), load("base/run-config.yaml"),
                   (KUBERAY / "Dockerfile").read_text(),
                   texts={name: (KUBERAY / name).read_text() for name in ("raycluster.yaml", "base/rayjob.yaml")})

    @classmethod
    def rendered(cls, variant: str, root: Path = KUBERAY, gpu_products: set[str] | None = GPU_PRODUCTS) -> Manifests:
        """A kustomize variant as `kubectl kustomize` renders it (what `kubectl apply -k` would apply)."""
        text = kustomize(root / variant)
        docs = {doc["kind"]: doc for doc in yaml.safe_load_all(text)}
        assert sorted(docs) == ["ConfigMap", "PersistentVolumeClaim", "RayJob"], sorted(docs)
        return cls(None, docs["RayJob"], docs["PersistentVolumeClaim"], docs["ConfigMap"],
                   (KUBERAY / "Dockerfile").read_text(), texts={f"{variant} (rendered)": text}, gpu_products=gpu_products)

    def specs(self) -> Iterator[tuple[str, Doc]]:
        if self.cluster is not None:
            yield "RayCluster", self.cluster["spec"]
        yield "RayJob", self.job["spec"]["rayClusterSpec"]

    def cluster_spec(self) -> Doc:
        return self.cluster["spec"] if self.cluster is not None else self.job["spec"]["rayClusterSpec"]


def kustomize(directory: Path) -> str:
    """`kubectl kustomize DIR`: kustomize as `kubectl apply -k` runs it (kubectl's own copy of kustomize).
    Without kubectl the test is skipped, unless KSEARCH_REQUIRE_KUBECTL is set (CI), where it fails."""
    if shutil.which("kubectl") is None:
        if os.environ.get("KSEARCH_REQUIRE_KUBECTL"):
            pytest.fail("kubectl is not installed, and KSEARCH_REQUIRE_KUBECTL is set")
        pytest.skip("kubectl is not installed (its kustomize renders deploy/kuberay's variants)")
    done = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


# ------------------------------------------------------------------------------------------ helpers


def groups(spec: Doc) -> Iterator[tuple[str, Doc]]:
    yield "head", spec["headGroupSpec"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["groupName"], group


def ray_container(group: Doc) -> Doc:
    return group["template"]["spec"]["containers"][0]  # KubeRay's rule: the Ray container comes first


def ray_node_types(spec: Doc) -> dict[str, Doc]:
    """Each group's Ray resources and worker counts, as Ray 2.60's KubeRay autoscaler derives them."""
    cr = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ksearch-ray", "namespace": "default"},
          "spec": spec}
    return _derive_autoscaling_config_from_ray_cr(copy.deepcopy(cr))["available_node_types"]


def pinned_ray_version() -> str:
    (pin,) = re.findall(r'ray\[default\]==([0-9][^"\'\s]*)', (REPO / "cluster.yaml").read_text())
    return pin


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))


class Captured(Exception):
    """What the fake session raises with the command's arguments: the search never starts."""

    def __init__(self, what: str, value: Any) -> None:
        super().__init__(what)
        self.what, self.value = what, value


class _FakeSession:
    @staticmethod
    def start(cfg: RunConfig, progress: bool) -> None:
        raise Captured("run", cfg)

    @staticmethod
    def resume(run_dir: Path, progress: bool, budget: dict[str, Any]) -> None:
        raise Captured("resume", run_dir)


def parse_with_ksearch(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Captured | str:
    """`python -u -m ksearch_ray ARGS`, through the real command line, up to the session it would
    start; or what the command line said instead."""
    if argv[:3] != ["-u", "-m", "ksearch_ray"]:
        return f"the entrypoint runs python {' '.join(argv[:3])}, not python -u -m ksearch_ray"
    monkeypatch.setattr(cli, "_session", lambda: _FakeSession)
    result = CliRunner().invoke(cli.app, argv[3:])
    if isinstance(result.exception, Captured):
        return result.exception
    return f"`ksearch {' '.join(argv[3:5])} ...` exits {result.exit_code}: {result.output.strip()}"


class _Submitted(Exception):
    def __init__(self, entrypoint: str) -> None:
        super().__init__(entrypoint)
        self.entrypoint = entrypoint


class _FakeJobClient:
    """Ray's job SDK client, as far as `ray job submit` uses it before anything leaves the process."""

    def submit_job(self, *, entrypoint: str, **kwargs: Any) -> str:
        raise _Submitted(entrypoint)


def _recorder(path: Path, record: Path) -> None:
    path.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    path.chmod(0o755)


def _recorded(record: Path) -> list[str]:
    words = record.read_text().split("\0")[:-1]
    record.unlink()
    return words


def run_entrypoint(entrypoint: str, tmp: Path, replace: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                   head_env: dict[str, str] | None = None) -> list[str] | str:
    """The argv `python` gets (or what failed instead) when KubeRay, `ray job submit` and Ray's job supervisor have run the
    RayJob's entrypoint (paths moved under tmp; `ray` and `python` recorders).

    The entrypoint goes through three shells' worth of quoting. KubeRay's submitter puts it verbatim
    into a bash command line (`ray job submit --address ... --no-wait -- ENTRYPOINT ;`, KubeRay's
    BuildJobSubmitCommand); Ray's `ray job submit` (its real click command here) joins the words it
    gets back into one string; the job supervisor runs that string with the shell (Popen shell=True).
    """
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    ray_record, python_record = tmp / "ray.argv", tmp / "python.argv"
    _recorder(bin_dir / "ray", ray_record)
    _recorder(bin_dir / "python", python_record)
    for old, new in replace.items():
        entrypoint = entrypoint.replace(old, new)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    job_env = {**(head_env or {}), **env}  # the job's shell runs on the head, with the head container's variables
    submitter = f"ray job submit --address http://127.0.0.1:8265 --no-wait -- {entrypoint.strip()} ;"
    done = subprocess.run(["/bin/bash", "-ce", "--", submitter], env=env, capture_output=True, text=True, timeout=10)
    if done.returncode or not ray_record.exists():
        return f"the submitter's bash fails on the entrypoint: {done.stderr.strip()}"
    words = _recorded(ray_record)
    monkeypatch.setattr(ray_job_cli, "_get_sdk_client", lambda *args, **kwargs: _FakeJobClient())
    result = ClickRunner().invoke(ray_job_cli.submit, words[2:])
    if not isinstance(result.exception, _Submitted):
        return f"`ray job submit` refuses the entrypoint: {result.output.strip()}"
    done = subprocess.run(result.exception.entrypoint, shell=True, env=job_env, capture_output=True, text=True, timeout=10)
    if done.returncode or not python_record.exists():
        return f"the job's shell fails on {result.exception.entrypoint!r}: {done.stderr.strip()}"
    return _recorded(python_record)


# ------------------------------------------------------------------ what must agree with the code


def problems(m: Manifests, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Everything wrong with the manifests; [] when they hold together with the code."""
    out: list[str] = []
    ray_version = ray.__version__
    if pinned_ray_version() != ray_version:
        out.append(f"cluster.yaml pins ray {pinned_ray_version()}, the project runs {ray_version}")

    # The image: one for every pod, tagged <project>-ray<ray>-py<python>, built by the Dockerfile.
    args = dockerfile_args(m.dockerfile)
    python_tag = args.get("PYTHON", "")
    if args.get("RAY_VERSION") != ray_version:
        out.append(f"Dockerfile RAY_VERSION {args.get('RAY_VERSION')} is not ray {ray_version}")
    requires = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    py = re.fullmatch(r"py3(\d+)", python_tag)
    if not py or Version(f"3.{py.group(1)}") not in requires:
        out.append(f"Dockerfile PYTHON {python_tag!r} is not a Python that requires-python {requires} allows")
    if not re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PYTHON\}-gpu$", m.dockerfile, flags=re.M):
        out.append("Dockerfile does not start from rayproject/ray:${RAY_VERSION}-${PYTHON}-gpu")
    tag = f"{ksearch_ray.__version__}-ray{ray_version}-{python_tag}"
    images = set()
    for kind, spec in m.specs():
        if spec.get("rayVersion") != ray_version:
            out.append(f"{kind} rayVersion {spec.get('rayVersion')} is not ray {ray_version}")
        if spec.get("authOptions", {}).get("mode") != "token":
            out.append(f"{kind} does not turn token authentication on (authOptions.mode: token)")
        for name, group in groups(spec):
            image = ray_container(group)["image"]
            images.add(image)
            if image.rpartition(":")[2] != tag:
                out.append(f"{kind} {name} image {image} is not tagged {tag}")
    if len(images) > 1:
        out.append(f"pods run different images: {sorted(images)}")
    if m.cluster is not None and m.job["spec"].get("rayClusterSpec") != m.cluster["spec"]:
        out.append("rayjob.yaml's rayClusterSpec differs from raycluster.yaml's spec")

    # Token auth: the operator's token only; nothing turns auth off, no token written down.
    for kind, doc in (("RayCluster", m.cluster), ("RayJob", m.job)):
        for env in _all_env(doc):
            if env.get("name") == "RAY_AUTH_MODE" and env.get("value") != "token":
                out.append(f"{kind} sets RAY_AUTH_MODE={env.get('value')}")
            if env.get("name") == "RAY_AUTH_TOKEN" and "value" in env:
                out.append(f"{kind} writes a RAY_AUTH_TOKEN value")
    for name, text in m.texts.items():
        if re.search(r"RAY_AUTH_MODE\s*=\s*disabled", text) or re.search(r"[0-9a-fA-F]{32,}", text):
            out.append(f"{name} turns token auth off or holds a token-like string")

    spec = m.cluster_spec()
    types = ray_node_types(spec)

    # The sandbox: every pod that runs candidates (evaluators, builds) can make unprivileged namespaces.
    for name, group in groups(spec):
        if name != "head":
            out += [f"group {name} {problem}" for problem in sandbox_problems(group)]

    # The run the entrypoint starts, as `ksearch run` parses it, and the resume it turns into.
    job = m.job["spec"]
    mounts = {path for path in _runs_mounts(spec, m.pvc["metadata"]["name"]).values()}
    mount = next(iter(mounts)) if len(mounts) == 1 else None
    config_dir, config_file = _config_mount(spec, m.config_map)
    (tmp / "runs-volume").mkdir(exist_ok=True)
    (tmp / "config").mkdir(exist_ok=True)
    for key, text in m.config_map["data"].items():
        (tmp / "config" / key).write_text(text)
    moved = {mount or "/nonexistent-mount": str(tmp / "runs-volume"), config_dir or "/nonexistent-config": str(tmp / "config")}
    head_env = {e["name"]: e["value"] for e in ray_container(spec["headGroupSpec"]).get("env", []) if "value" in e}
    argv = run_entrypoint(job["entrypoint"], tmp, moved, monkeypatch, head_env)
    if isinstance(argv, str):
        return [*out, argv]
    started = parse_with_ksearch(argv, monkeypatch)
    if isinstance(started, str):
        return [*out, started]
    if started.what != "run":
        out.append(f"with no run directory yet the entrypoint runs `ksearch {started.what}`, not `ksearch run`")
        return out
    cfg: RunConfig = started.value
    if cfg.evaluation.isolation != "require":
        out.append(f"the run's evaluation.isolation is {cfg.evaluation.isolation}, not require: a pod without "
                   "namespaces would run candidates unprotected")
    if "--config" not in argv or PurePosixPath(argv[argv.index("--config") + 1]).name != config_file:
        out.append(f"the entrypoint's --config is not the ConfigMap file {config_file} mounted on the head")
    run_dir = Path(cfg.run_dir or "")
    if not run_dir.is_absolute() or not run_dir.is_relative_to(tmp / "runs-volume"):
        out.append(f"--run-dir {cfg.run_dir} is not on the shared volume (mounted at {sorted(mounts)} on every pod)")
    else:
        (run_dir / "manifest.json").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "manifest.json").write_text("{}")
        argv_again = run_entrypoint(job["entrypoint"], tmp, moved, monkeypatch, head_env)
        again = argv_again if isinstance(argv_again, str) else parse_with_ksearch(argv_again, monkeypatch)
        if isinstance(again, str):
            out.append(again)
        elif again.what != "resume" or Path(again.value) != run_dir:
            what = f"resume {again.value}" if again.what == "resume" else again.what
            out.append(f"with a run in {run_dir} the entrypoint runs `ksearch {what}`, not a resume of it")
    if cfg.progress:
        out.append("the entrypoint leaves the live view on (--no-progress: a job log is not a terminal)")

    # Builds: the resource the config sends them to is declared by the build group alone, with no GPU.
    # A cluster without CPU-only workers (the one-GPU variant) builds on its GPU pods: no resource named.
    build = cfg.cluster.build_resource
    declaring = [name for name, t in types.items() if build and t["resources"].get(build)]
    cpu_only = [name for name, t in types.items() if name != _HEAD_GROUP_NAME and not t["resources"].get("GPU")]
    if not build and not cpu_only:
        pass
    elif not build or len(declaring) != 1:
        out.append(f"build_resource {build!r} is declared by groups {declaring}, not by exactly one build group")
    elif types[declaring[0]]["resources"].get("GPU"):
        out.append(f"the build group {declaring[0]} has GPUs")
    elif types[declaring[0]]["resources"][build] != types[declaring[0]]["resources"]["CPU"]:
        out.append(f"the build group declares {build} unequal to its CPUs (builds would idle or queue)")

    # Evaluators: one per GPU, on H100/H200 nodes, a fixed count that --evaluators asks for.
    # Pods without GPU limits can still see a node's GPUs (CUDA images set NVIDIA_VISIBLE_DEVICES=all):
    # the groups that must have no evaluator say num-gpus 0 themselves.
    for name, group in groups(spec):
        if "nvidia.com/gpu" not in ray_container(group).get("resources", {}).get("limits", {}) and \
                group.get("rayStartParams", {}).get("num-gpus") != "0":
            out.append(f"group {name} has no GPU limit but does not set rayStartParams num-gpus \"0\"")
    head = types[_HEAD_GROUP_NAME]["resources"]
    if head.get("GPU") or head.get("CPU"):
        out.append(f"the head offers Ray CPU {head.get('CPU')} / GPU {head.get('GPU')}: tasks and evaluators could land beside the driver")
    gpus = 0
    for name, group in groups(spec):
        t = types[_HEAD_GROUP_NAME if name == "head" else name]
        if not t["resources"].get("GPU"):
            continue
        gpus += t["resources"]["GPU"] * t["max_workers"]
        pod = group["template"]["spec"]
        limits = ray_container(group).get("resources", {}).get("limits", {})
        requests = ray_container(group).get("resources", {}).get("requests", {})
        if "nvidia.com/gpu" in requests and str(requests["nvidia.com/gpu"]) != str(limits.get("nvidia.com/gpu")):
            out.append(f"group {name}: GPU requests differ from limits (Kubernetes refuses that for extended resources)")
        if str(limits.get("nvidia.com/gpu")) != str(t["resources"]["GPU"]):
            out.append(f"group {name}: Ray sees {t['resources']['GPU']} GPUs, the pod asks for {limits.get('nvidia.com/gpu')}")
        if not (group.get("minReplicas") == group.get("maxReplicas") == group.get("replicas")):
            out.append(f"group {name}: GPU pods must not scale under running evaluators (minReplicas == maxReplicas)")
        if not any(tol.get("key") == "nvidia.com/gpu" for tol in pod.get("tolerations", [])):
            out.append(f"group {name} does not tolerate the nvidia.com/gpu taint")
        if m.gpu_products is None:
            if not _required_labels(pod):
                out.append(f"group {name} requires no node label: its pods could land on nodes without a GPU")
        else:
            products = set(_required_values(pod, "nvidia.com/gpu.product"))
            if not products or not products <= m.gpu_products:
                out.append(f"group {name} is not held to H100/H200 nodes (nvidia.com/gpu.product in {sorted(products)})")
    if cfg.evaluation.evaluators != gpus:
        out.append(f"--evaluators {cfg.evaluation.evaluators} but the GPU groups hold {gpus} GPUs")

    # The LLM key: where the planner and coder run (the head), and nowhere else.
    key_env = cfg.llm.api_key_env
    for name, group in groups(spec):
        has_key = any(e.get("name") == key_env for e in ray_container(group).get("env", []))
        if has_key != (name == "head"):
            out.append(f"group {name} {'has' if has_key else 'lacks'} {key_env}")

    # The job: the cluster goes when the search ends, a retry resumes, the driver stays on the head.
    if job.get("shutdownAfterJobFinishes") is not True:
        out.append("shutdownAfterJobFinishes is not true: GPU pods outlive the search")
    if not job.get("backoffLimit"):
        out.append("backoffLimit 0: a failed attempt is not resumed")
    if job.get("submissionMode", "K8sJobMode") not in {"K8sJobMode", "HTTPMode", "SidecarMode"}:
        out.append(f"submissionMode {job.get('submissionMode')} submits nothing")
    for key in ("entrypointNumCpus", "entrypointNumGpus", "entrypointResources"):
        if key in job:
            out.append(f"{key} would move the driver off the head, away from its actors")
    return out


def sandbox_problems(group: Doc) -> list[str]:
    """What keeps the sandbox's unprivileged user, mount and PID namespaces from working in a group's pods
    (docs/cluster.md, "The sandbox on Kubernetes")."""
    pod, ctx = group["template"]["spec"], ray_container(group).get("securityContext", {})
    out = []
    if pod.get("hostUsers") is not False:
        out.append("shares the node's user namespace (hostUsers: false is what allows an unmasked /proc)")
    if ctx.get("procMount") != "Unmasked":
        out.append("masks /proc (procMount: Unmasked): no fresh /proc can be mounted for a candidate")
    for key in ("seccompProfile", "appArmorProfile"):
        if ctx.get(key, {}).get("type") not in ("Unconfined", "Localhost"):
            out.append(f"keeps the runtime's default {key}, which refuses unshare and mount")
    if ctx.get("privileged") or ctx.get("allowPrivilegeEscalation") is not False:
        out.append("allows privileges (privileged, or no allowPrivilegeEscalation: false)")
    if ctx.get("capabilities", {}).get("drop") != ["ALL"] or not ctx.get("runAsNonRoot") or not ctx.get("runAsUser"):
        out.append("runs with capabilities or as root (the sandbox needs neither)")
    return out


def _all_env(doc: Any) -> Iterator[Doc]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "env" and isinstance(value, list):
                yield from value
            else:
                yield from _all_env(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _all_env(item)


def _runs_mounts(spec: Doc, claim: str) -> dict[str, str | None]:
    """Each group's mount path of the run-directory claim (None: not mounted)."""
    out: dict[str, str | None] = {}
    for name, group in groups(spec):
        pod = group["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
        paths = [vm["mountPath"] for vm in ray_container(group).get("volumeMounts", []) if vm["name"] in volumes]
        out[name] = paths[0] if len(paths) == 1 else None
    return out


def _config_mount(spec: Doc, config_map: Doc) -> tuple[str | None, str | None]:
    """(directory, file) where the head mounts the run-config ConfigMap."""
    head = spec["headGroupSpec"]
    names = {v["name"] for v in head["template"]["spec"].get("volumes", [])
             if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]}
    paths = [vm["mountPath"] for vm in ray_container(head).get("volumeMounts", []) if vm["name"] in names]
    keys = list(config_map.get("data", {}))
    return (paths[0] if paths else None), (keys[0] if len(keys) == 1 else None)


def _required_labels(pod: Doc) -> dict[str, list[str]]:
    """The node labels (key -> values) a pod's required node affinity holds it to with `In`."""
    terms = (pod.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    return {e["key"]: e.get("values", []) for term in terms for e in term.get("matchExpressions", [])
            if e.get("operator") == "In" and e.get("values")}


def _required_values(pod: Doc, key: str) -> list[str]:
    terms = (pod.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    values = [v for term in terms for e in term.get("matchExpressions", [])
              if e.get("key") == key and e.get("operator") == "In" for v in e.get("values", [])]
    selector = pod.get("nodeSelector", {})
    return values + ([selector[key]] if key in selector else [])


# ----------------------------------------------------------------------------------------- tests


def test_manifests_agree_with_the_code(m: Manifests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert problems(m, tmp_path, monkeypatch) == []


def test_every_pod_mounts_the_run_volume_at_one_path(m: Manifests) -> None:
    for _kind, spec in m.specs():
        mounts = _runs_mounts(spec, m.pvc["metadata"]["name"])
        assert None not in mounts.values(), mounts
        assert len(set(mounts.values())) == 1, mounts
    assert m.pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_ray_reads_the_layout_of_cluster_yaml(m: Manifests) -> None:
    """Head without GPUs or CPUs, 8-GPU evaluator pods, CPU build pods declaring ksearch_build."""
    types = ray_node_types(m.cluster_spec())
    assert set(types) == {_HEAD_GROUP_NAME, "gpu", "build"}
    assert types[_HEAD_GROUP_NAME]["resources"]["ksearch_head"] == 1
    assert types["gpu"]["resources"]["GPU"] == 8 and types["gpu"]["min_workers"] == types["gpu"]["max_workers"] == 2
    assert types["build"]["resources"].get("GPU", 0) == 0 and types["build"]["resources"]["ksearch_build"] == 64
    assert types["build"]["min_workers"] == 0 < types["build"]["max_workers"]


def test_ray_rejects_custom_resources_written_as_plain_json(m: Manifests) -> None:
    """rayStartParams.resources must be KubeRay's quoted form, '"{\\"name\\": n}"'; Ray says so."""
    spec = copy.deepcopy(m.cluster["spec"])
    spec["workerGroupSpecs"][1]["rayStartParams"]["resources"] = '{"ksearch_build": 64}'
    with pytest.raises(json.JSONDecodeError):
        ray_node_types(spec)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_standard_kinds_validate_against_kubernetes_schemas(m: Manifests, version: str) -> None:
    for doc in (m.pvc, m.config_map):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_pod_template_is_a_valid_kubernetes_pod_template(m: Manifests, version: str) -> None:
    for kind, spec in m.specs():
        for name, group in groups(spec):
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{kind}-{name}".lower()},
                       "template": group["template"]}
            kubernetes_validate.validate(wrapped, version, strict=True)


def test_kubernetes_schema_rejects_a_misspelled_pod_field(m: Manifests) -> None:
    template = copy.deepcopy(m.cluster["spec"]["workerGroupSpecs"][0]["template"])
    template["spec"]["containers"][0]["volumeMount"] = template["spec"]["containers"][0].pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                      "template": template}, K8S_VERSIONS[-1], strict=True)
    pvc = copy.deepcopy(m.pvc)
    pvc["spec"]["accessModes"] = "ReadWriteMany"  # a string, not a list
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pvc, K8S_VERSIONS[-1], strict=True)


def _both(change: Callable[[Doc], None]) -> Callable[[Manifests], None]:
    """Break the RayCluster spec and the RayJob's copy alike (so only the named invariant fires)."""
    def apply(m: Manifests) -> None:
        change(m.cluster["spec"])
        change(m.job["spec"]["rayClusterSpec"])
    return apply


def _gpu(spec: Doc) -> Doc:
    return spec["workerGroupSpecs"][0]


def _entry(old: str, new: str) -> Callable[[Manifests], None]:
    def apply(m: Manifests) -> None:
        assert old in m.job["spec"]["entrypoint"], old
        m.job["spec"]["entrypoint"] = m.job["spec"]["entrypoint"].replace(old, new)
    return apply


def _set_image(image: str) -> Callable[[Doc], None]:
    def apply(spec: Doc) -> None:
        for _name, group in groups(spec):
            ray_container(group)["image"] = image
    return apply


BREAKAGES: dict[str, tuple[Callable[[Manifests], None], str]] = {
    "ray version": (_both(lambda s: s.update(rayVersion="2.59.0")), "rayVersion 2.59.0"),
    "image tag": (_both(_set_image("registry.example.com/ksearch-ray:latest")), "is not tagged"),
    "one image": (_both(lambda s: ray_container(_gpu(s)).update(image=ray_container(_gpu(s))["image"] + "x")),
                  "different images"),
    "dockerfile ray": (lambda m: setattr(m, "dockerfile", m.dockerfile.replace("RAY_VERSION=2.60.0", "RAY_VERSION=2.59.0")),
                       "Dockerfile RAY_VERSION"),
    "dockerfile python": (lambda m: setattr(m, "dockerfile", m.dockerfile.replace("PYTHON=py312", "PYTHON=py313")),
                          "requires-python"),
    "job drifts": (lambda m: m.job["spec"]["rayClusterSpec"]["workerGroupSpecs"][1].update(maxReplicas=9), "differs"),
    "auth off": (_both(lambda s: s.pop("authOptions")), "token authentication"),
    "auth env": (_both(lambda s: ray_container(_gpu(s)).setdefault("env", []).append({"name": "RAY_AUTH_MODE", "value": "disabled"})),
                 "RAY_AUTH_MODE=disabled"),
    "token written": (_both(lambda s: ray_container(_gpu(s)).setdefault("env", []).append({"name": "RAY_AUTH_TOKEN", "value": "x"})),
                      "writes a RAY_AUTH_TOKEN"),
    "build resource renamed": (_both(lambda s: s["workerGroupSpecs"][1]["rayStartParams"].update(
        resources='"{\\"ksearch_builds\\": 64}"')), "not by exactly one build group"),
    "config names another resource": (lambda m: m.config_map["data"].update({"run.yaml": "cluster:\n  build_resource: builders\n"}),
                                      "not by exactly one build group"),
    "builds beside GPUs": (_both(lambda s: _gpu(s)["rayStartParams"].update(resources='"{\\"ksearch_build\\": 8}"')),
                           "not by exactly one build group"),
    "evaluator count": (_entry("--evaluators 16", "--evaluators 12"), "--evaluators 12 but the GPU groups hold 16"),
    "gpu count": (_both(lambda s: ray_container(_gpu(s))["resources"]["limits"].update({"nvidia.com/gpu": "4"})),
                  "the GPU groups hold 8 GPUs"),
    "gpu autoscaled": (_both(lambda s: _gpu(s).update(minReplicas=0)), "must not scale"),
    "no toleration": (_both(lambda s: _gpu(s)["template"]["spec"].pop("tolerations")), "taint"),
    "any gpu": (_both(lambda s: _gpu(s)["template"]["spec"].pop("affinity")), "H100/H200"),
    "head gpus": (_both(lambda s: s["headGroupSpec"]["rayStartParams"].pop("num-gpus")), "group head has no GPU limit"),
    "head cpus": (_both(lambda s: s["headGroupSpec"]["rayStartParams"].pop("num-cpus")), "beside the driver"),
    "run dir off the volume": (_entry("RUN=/mnt/ksearch/runs/trimul-1", "RUN=/tmp/runs/trimul-1"), "not on the shared volume"),
    "volume moved on one group": (_both(lambda s: ray_container(_gpu(s))["volumeMounts"][0].update(mountPath="/runs")),
                                  "not on the shared volume"),
    "no resume": (_entry('if [ -e "$RUN/manifest.json" ]', 'if false'), "not a resume"),
    "config not mounted": (_entry("--config /etc/ksearch/run.yaml", "--config /etc/ksearch/other.yaml"), "exits 2"),
    "key on workers": (_both(lambda s: ray_container(_gpu(s)).setdefault("env", []).append(
        copy.deepcopy(ray_container(s["headGroupSpec"])["env"][0]))), "group gpu has OPENAI_API_KEY"),
    "cluster kept": (lambda m: m.job["spec"].update(shutdownAfterJobFinishes=False), "outlive the search"),
    "no retry": (lambda m: m.job["spec"].update(backoffLimit=0), "not resumed"),
    "driver moved": (lambda m: m.job["spec"].update(entrypointNumGpus=1), "off the head"),
    "expanded by the submitter's bash": (lambda m: m.job["spec"].update(entrypoint=m.job["spec"]["entrypoint"].replace(
        "bash -c 'RUN=", 'bash -c "RUN=').replace("fi'", 'fi"')), "not on the shared volume"),
    "isolation best-effort": (lambda m: m.config_map["data"].update({"run.yaml": m.config_map["data"]["run.yaml"].replace(
        "isolation: require", "isolation: best-effort")}), "not require"),
    "no isolation setting": (lambda m: m.config_map["data"].update({"run.yaml": "cluster:\n  build_resource: ksearch_build\n"}),
                             "not require"),
    "default seccomp": (_both(lambda s: ray_container(_gpu(s))["securityContext"].pop("seccompProfile")), "seccompProfile"),
    "default apparmor on builds": (_both(lambda s: ray_container(s["workerGroupSpecs"][1])["securityContext"].pop("appArmorProfile")),
                                   "group build keeps the runtime's default appArmorProfile"),
    "masked proc": (_both(lambda s: ray_container(_gpu(s))["securityContext"].update(procMount="Default")), "masks /proc"),
    "host users": (_both(lambda s: _gpu(s)["template"]["spec"].pop("hostUsers")), "user namespace"),
    "privileged": (_both(lambda s: ray_container(_gpu(s))["securityContext"].update(privileged=True)), "allows privileges"),
    "live view": (_entry('--run-dir "$RUN" --no-progress;', '--run-dir "$RUN";'), "live view"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_manifest_is_caught(breakage: str, m: Manifests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    change, expected = BREAKAGES[breakage]
    change(m)
    found = problems(m, tmp_path, monkeypatch)
    assert found, f"{breakage}: not caught"
    if expected:
        assert any(expected in p for p in found), found


def test_the_entrypoint_flags_are_real_ksearch_run_flags(m: Manifests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag `ksearch run` does not have fails the command line, so the entrypoint check can fail."""
    entry = m.job["spec"]["entrypoint"].replace("--width 32", "--search-width 32")
    argv = run_entrypoint(entry, tmp_path, {"/mnt/ksearch": str(tmp_path)}, monkeypatch)
    assert isinstance(argv, list), argv
    monkeypatch.setattr(cli, "_session", lambda: _FakeSession)
    result = CliRunner().invoke(cli.app, argv[3:])
    assert result.exit_code == 2 and "--search-width" in result.output
    assert shlex.split(m.job["spec"]["entrypoint"])[:2] == ["bash", "-c"]


def test_the_documented_kubernetes_commands_are_real_ksearch_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cluster.md's `ksearch run` commands for KubeRay parse into a run on the shared volume."""
    section = (REPO / "docs" / "cluster.md").read_text().partition("## Kubernetes (KubeRay)")[2]
    assert section, "docs/cluster.md has no Kubernetes (KubeRay) section"
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = [c for b in blocks for c in b.replace("\\\n", " ").splitlines() if "python -m ksearch_ray run" in c]
    assert commands
    config = tmp_path / "run.yaml"
    config.write_text(_parsed("base/run-config.yaml")["data"]["run.yaml"])
    m = Manifests.load()
    mount = _runs_mounts(m.cluster["spec"], m.pvc["metadata"]["name"])["head"]
    assert mount
    for command in commands:
        words = shlex.split(command.replace("/etc/ksearch/run.yaml", str(config)))
        argv = ["-u", "-m", "ksearch_ray", *words[words.index("ksearch_ray") + 1:]]
        started = parse_with_ksearch(argv, monkeypatch)
        assert isinstance(started, Captured) and started.what == "run", started
        assert PurePosixPath(started.value.run_dir).is_relative_to(mount), started.value.run_dir
        assert started.value.cluster.build_resource == "ksearch_build"


# ------------------------------------------------------------------- the kustomize variants


VARIANT_PRODUCTS: dict[str, set[str] | None] = {"one-gpu": None, "eight-gpu": GPU_PRODUCTS}


def _rendered_docs(directory: Path) -> list[Doc]:
    return sorted(yaml.safe_load_all(kustomize(directory)), key=lambda d: d["kind"])


def test_the_base_renders_its_files_and_the_eight_gpu_variant_with_its_values_renders_the_base() -> None:
    """`kubectl apply -k deploy/kuberay/base` is `kubectl apply -f` of its three files, and the shipped
    eight-gpu/values.yaml holds exactly what those files hold: the 8-GPU setup is a variant of the base."""
    files = sorted((load(f"base/{n}") for n in ("pvc.yaml", "run-config.yaml", "rayjob.yaml")), key=lambda d: d["kind"])
    assert _rendered_docs(KUBERAY / "base") == files
    assert _rendered_docs(KUBERAY / "eight-gpu") == files


@pytest.mark.parametrize("variant", sorted(VARIANT_PRODUCTS))
def test_a_rendered_variant_agrees_with_the_code(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = Manifests.rendered(variant, gpu_products=VARIANT_PRODUCTS[variant])
    assert problems(m, tmp_path, monkeypatch) == []
    for version in K8S_VERSIONS:
        for doc in (m.pvc, m.config_map):
            kubernetes_validate.validate(doc, version, strict=True)
        for name, group in groups(m.cluster_spec()):
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                                          "template": group["template"]}, version, strict=True)


def test_the_one_gpu_variant_is_one_gpu_pod_and_a_small_head() -> None:
    m = Manifests.rendered("one-gpu", gpu_products=None)
    types = ray_node_types(m.cluster_spec())
    assert set(types) == {_HEAD_GROUP_NAME, "gpu"}
    assert types["gpu"]["resources"]["GPU"] == 1 and types["gpu"]["min_workers"] == types["gpu"]["max_workers"] == 1
    assert types[_HEAD_GROUP_NAME]["resources"].get("CPU", 0) == 0
    head = ray_container(m.cluster_spec()["headGroupSpec"])["resources"]
    assert head["limits"] == head["requests"] == {"cpu": "2", "memory": "8Gi"}
    gpu = _required_labels(m.cluster_spec()["workerGroupSpecs"][0]["template"]["spec"])
    assert gpu == {"nvidia.com/gpu.present": ["true"]}
    assert m.job["metadata"]["name"] != load("base/rayjob.yaml")["metadata"]["name"]  # both can live in one namespace


def _values_of(root: Path, variant: str, change: Doc) -> None:
    path = root / variant / "values.yaml"
    values = yaml.safe_load(path.read_text())
    for key, value in change.items():
        values[key] = value
    path.write_text(yaml.safe_dump(values))


@pytest.mark.parametrize("variant", sorted(VARIANT_PRODUCTS))
def test_every_value_a_user_sets_in_values_yaml_reaches_every_place_that_needs_it(
        variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Edit only the variant's values.yaml (a copy of deploy/kuberay): the image, storage class, CPUs,
    memory, node label (and the one-GPU variant's GPU count) reach every pod, the claim and the
    entrypoint's --evaluators, and no placeholder is left anywhere."""
    root = tmp_path / "kuberay"
    shutil.copytree(KUBERAY, root)
    tag = f"{ksearch_ray.__version__}-ray{ray.__version__}-{dockerfile_args((KUBERAY / 'Dockerfile').read_text())['PYTHON']}"
    image = f"gcr.example.org/team/ksearch-ray:{tag}"
    change: Doc = {"image": image, "storageClassName": "nfs-client", "head": {"cpu": "3", "memory": "12Gi"},
                   "gpuPod": {"cpu": "6", "memory": "40Gi"},
                   "gpuNodes": {"key": "cloud.google.com/gke-accelerator", "values": ["nvidia-l4"]}}
    if variant == "one-gpu":
        change["gpus"] = "2"
    _values_of(root, variant, change)
    m = Manifests.rendered(variant, root=root, gpu_products=None)
    text = next(iter(m.texts.values()))
    assert "registry.example.com" not in text and "rwx-storage-class" not in text
    assert m.pvc["spec"]["storageClassName"] == "nfs-client"
    spec = m.cluster_spec()
    assert {ray_container(g)["image"] for _n, g in groups(spec)} == {image}
    head = ray_container(spec["headGroupSpec"])["resources"]
    assert head["requests"] == head["limits"] == {"cpu": "3", "memory": "12Gi"}
    gpu_group = next(g for n, g in groups(spec) if n == "gpu")
    resources = ray_container(gpu_group)["resources"]
    gpus = "2" if variant == "one-gpu" else "8"
    assert resources["requests"] == resources["limits"] == {"cpu": "6", "memory": "40Gi", "nvidia.com/gpu": gpus}
    assert _required_labels(gpu_group["template"]["spec"]) == {"cloud.google.com/gke-accelerator": ["nvidia-l4"]}
    (tmp_path / "check").mkdir()
    assert problems(m, tmp_path / "check", monkeypatch) == []  # --evaluators follows the GPU count


def test_a_one_gpu_variant_whose_evaluators_and_gpus_differ_or_that_requires_no_gpu_node_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = Manifests.rendered("one-gpu", gpu_products=None)
    env = ray_container(m.cluster_spec()["headGroupSpec"])["env"]
    next(e for e in env if e["name"] == "KSEARCH_EVALUATORS")["value"] = "3"
    (tmp_path / "a").mkdir()
    assert any("--evaluators 3 but the GPU groups hold 1" in p for p in problems(m, tmp_path / "a", monkeypatch))
    m = Manifests.rendered("one-gpu", gpu_products=None)
    m.cluster_spec()["workerGroupSpecs"][0]["template"]["spec"].pop("affinity")
    (tmp_path / "b").mkdir()
    assert any("requires no node label" in p for p in problems(m, tmp_path / "b", monkeypatch))
