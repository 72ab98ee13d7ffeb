"""cluster.yaml, checked offline with the Ray cluster launcher's own config code.

`ray up` runs prepare_config (merge with the AWS defaults, fill per-node-type worker
counts) and then validate_config (the launcher's JSON schema plus its cross-field
checks) before it talks to AWS; these tests run the same two functions and stop there.
On top of that they check the properties the rest of ksearch-ray relies on: a head
without GPUs that carries the custom resource "ksearch_head", GPU workers, CPU build workers
that declare "ksearch_build" and no GPU (and GPU workers that do not take builds), `ray start`
flags that agree with the declared resources, RAY_AUTH_MODE=token on every node, and no
auth token written into the file. Each of those checks is also shown to fire on a broken
copy, so that none of them passes vacuously.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parent.parent
CLUSTER_YAML = REPO / "cluster.yaml"
HEAD_RESOURCE = "ksearch_head"
BUILD_RESOURCE = "ksearch_build"  # what `build_resource: ksearch_build` sends builds to
DEFAULT_TOKEN_PATH = "~/.ray/auth_token"  # where Ray looks when RAY_AUTH_TOKEN(_PATH) are unset

Config = dict[str, Any]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach AWS (or anything else) fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="module")
def raw_text() -> str:
    return CLUSTER_YAML.read_text()


@pytest.fixture
def raw(raw_text: str) -> Config:
    return yaml.safe_load(raw_text)


def ray_validate(config: Config) -> Config:
    """What `ray up` does to the file before it contacts the cloud provider."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


# ---------------------------------------------------------------- parsing helpers


def ray_start(commands: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(environment assignments, --flags) of the one `ray start` among shell commands."""
    found = []
    for command in commands:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = list(lexer)
        segments: list[list[str]] = [[]]
        for word in words:
            if word in {";", "&&", "||", "|", "&"}:
                segments.append([])
            else:
                segments[-1].append(word)
        for seg in segments:
            env = {}
            while seg and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", seg[0]):
                name, _, value = seg.pop(0).partition("=")
                env[name] = value
            if seg[:2] == ["ray", "start"]:
                flags = {}
                for arg in seg[2:]:
                    assert arg.startswith("--"), f"unexpected argument {arg!r} in {command!r}"
                    name, _, value = arg.partition("=")
                    flags[name] = value
                found.append((env, flags))
    assert len(found) == 1, f"expected exactly one `ray start`, found {len(found)} in {commands!r}"
    return found[0]


def strings(node: Any) -> Iterator[str]:
    """Every key and string value in a loaded YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


_HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")
_B64_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_TOKEN_ASSIGNMENT = re.compile(r"RAY_AUTH_TOKEN\s*[=:]\s*(['\"]?)([^\s'\"]*)")


def secret_like(text: str) -> list[str]:
    """Substrings that look like an auth token: `ray get-auth-token --generate` writes 64 hex
    characters; `openssl rand -base64 32` (KubeRay's example) 44 base64 characters."""
    hits = [m.group() for m in _HEX_RUN.finditer(text)]
    for m in _B64_RUN.finditer(text):
        run = m.group()
        if re.search(r"[a-z]", run) and re.search(r"[A-Z]", run) and re.search(r"[0-9]", run):
            hits.append(run)
    for m in _TOKEN_ASSIGNMENT.finditer(text):
        value = m.group(2)
        if value and not value.startswith("$"):  # "$VAR" / "$(cat file)" are references
            hits.append(m.group())
    return hits


def _worker_types(config: Config) -> dict[str, Config]:
    return {n: t for n, t in config["available_node_types"].items() if n != config["head_node_type"]}


def problems(config: Config, text: str | None = None) -> list[str]:
    """The properties ksearch-ray relies on; an empty list means all hold."""
    out: list[str] = []
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    workers = _worker_types(config)

    # Head: declares GPU 0 explicitly and carries the driver-side resource.
    if head["resources"].get("GPU") != 0:
        out.append(f"head must declare GPU: 0, declares {head['resources'].get('GPU')!r}")
    if head["resources"].get(HEAD_RESOURCE, 0) < 1:
        out.append(f"head must declare {HEAD_RESOURCE} >= 1")
    if re.match(r"(p|g)\d", head["node_config"]["InstanceType"]):
        out.append(f"head instance type {head['node_config']['InstanceType']} is a GPU type")
    # Workers: GPU types for evaluators, CPU types for builds; nobody else gets the head resource.
    gpu_types = [n for n, wt in workers.items() if wt["resources"].get("GPU", 0) >= 1]
    build_types = [n for n, wt in workers.items() if wt["resources"].get(BUILD_RESOURCE, 0) > 0]
    if not gpu_types:
        out.append("no GPU worker node type")
    if not build_types:
        out.append(f"no build worker node type (declaring {BUILD_RESOURCE})")
    for name, wt in workers.items():
        if name not in gpu_types and name not in build_types:
            out.append(f"worker type {name} declares neither a GPU nor {BUILD_RESOURCE}")
        if name in gpu_types and name in build_types:
            out.append(f"worker type {name} has GPUs and takes builds: nvcc would run beside measurements")
        if name in build_types and wt["resources"].get("GPU") != 0:
            out.append(f"build worker type {name} must declare GPU: 0")
        if HEAD_RESOURCE in wt["resources"]:
            out.append(f"worker type {name} declares {HEAD_RESOURCE}")
        if wt["node_config"].get("ImageId") != head["node_config"].get("ImageId"):
            out.append(f"worker type {name} uses another AMI than the head")

    # `ray start` on the head: no GPUs, the head resource, dashboard for `ray job submit`, auth.
    env, flags = ray_start(config["head_start_ray_commands"])
    if "--head" not in flags:
        out.append("head start command lacks --head")
    if flags.get("--num-gpus") != "0":
        out.append(f"head start command must carry --num-gpus=0, has {flags.get('--num-gpus')!r}")
    head_res = json.loads(flags.get("--resources") or "{}")
    if head_res.get(HEAD_RESOURCE) != head["resources"].get(HEAD_RESOURCE):
        out.append(f"head --resources {head_res} disagrees with the declared {head['resources']}")
    if flags.get("--dashboard-host") != "0.0.0.0":
        out.append("head dashboard must listen on 0.0.0.0 for ray job submit")
    if env.get("RAY_AUTH_MODE") != "token":
        out.append("head `ray start` must run with RAY_AUTH_MODE=token")

    # `ray start` on workers: join the head, auth. One command serves every worker type, so it
    # pins no resources (each type's declaration arrives as RAY_OVERRIDE_RESOURCES), and a node
    # whose visible GPUs differ from its type's declaration fails before it joins.
    env, flags = ray_start(config["worker_start_ray_commands"])
    if not flags.get("--address", "").startswith("$RAY_HEAD_IP:"):
        out.append("worker start command must join $RAY_HEAD_IP")
    for flag in ("--num-gpus", "--num-cpus", "--resources"):
        if flag in flags:
            out.append(f"worker start command pins {flag}, which some worker type does not declare")
    if not any("nvidia-smi -L" in c and "RAY_OVERRIDE_RESOURCES" in c for c in config["worker_start_ray_commands"]):
        out.append("worker start commands do not check the visible GPUs against the declared ones")
    if env.get("RAY_AUTH_MODE") != "token":
        out.append(
            "worker `ray start` must run with RAY_AUTH_MODE=token (workers never turn it on by themselves)"
        )

    # The token: read by Ray from ~/.ray/auth_token on each node, copied there from a file
    # outside the repository, never written into the config.
    source = config.get("file_mounts", {}).get(DEFAULT_TOKEN_PATH)
    if source is None:
        out.append(f"no file mount provides {DEFAULT_TOKEN_PATH}")
    elif not (source.startswith("~") or os.path.isabs(source)):
        out.append(f"token source {source!r} is relative, i.e. inside the repository")
    elif Path(os.path.expanduser(source)).resolve().is_relative_to(REPO):
        out.append(f"token source {source!r} is inside the repository")
    for s in strings(config):
        # The length only: a test report must not print a real token.
        out.extend(f"token-like literal ({len(hit)} chars) in the config" for hit in secret_like(s))
    if text is not None:
        out.extend(f"token-like literal ({len(hit)} chars) in the file text" for hit in secret_like(text))
    return out


# ---------------------------------------------------------------- the real file


def test_ray_validates_cluster_yaml(raw: Config) -> None:
    prepared = ray_validate(raw)
    assert prepared["cluster_name"] == "ksearch-ray"
    assert prepared["provider"]["type"] == "aws"
    # prepare_config prepends setup_commands to both role-specific lists: auth set-up and
    # the token check run on every node, and the head also gets boto3 for the autoscaler.
    for role in ("head_setup_commands", "worker_setup_commands"):
        joined = "\n".join(prepared[role])
        assert "export RAY_AUTH_MODE=token" in joined, role
        assert f"test -s {DEFAULT_TOKEN_PATH}" in joined, role
        assert "pip install ~/ksearch-ray" in joined, role
    assert any("boto3" in c for c in prepared["head_setup_commands"])


def test_properties_we_rely_on(raw: Config, raw_text: str) -> None:
    assert problems(raw, raw_text) == []


def test_node_types(raw: Config) -> None:
    types = raw["available_node_types"]
    head = types[raw["head_node_type"]]
    assert head["resources"]["GPU"] == 0 and head["resources"][HEAD_RESOURCE] == 1
    assert head.get("max_workers", 0) == 0
    workers = _worker_types(raw)
    assert set(workers) == {"ray.worker.h100", "ray.worker.cpu"}
    gpu, build = workers["ray.worker.h100"], workers["ray.worker.cpu"]
    assert gpu["node_config"]["InstanceType"] == "p5.48xlarge"
    assert gpu["resources"] == {"CPU": 192, "GPU": 8}
    assert build["resources"]["GPU"] == 0 and build["resources"][BUILD_RESOURCE] == build["resources"]["CPU"]
    for worker in workers.values():
        assert 0 <= worker["min_workers"] <= worker["max_workers"] <= raw["max_workers"]
    assert sum(w["max_workers"] for w in workers.values()) <= raw["max_workers"]
    # A placeholder of the shape AWS uses, to be replaced per region (see the comment).
    assert re.fullmatch(r"ami-[0-9a-f]{8}(?:[0-9a-f]{9})?", head["node_config"]["ImageId"])


def test_setup_installs_the_ray_version_in_use(raw: Config) -> None:
    pins = re.findall(r'ray\[default\]==([0-9][^"\'\s]*)', "\n".join(raw["setup_commands"]))
    assert pins == [ray.__version__]
    # GPU nodes keep the AMI's CUDA torch: no torch pin anywhere in the commands.
    assert not any(re.search(r"\btorch==", c) for c in raw["setup_commands"])


def test_token_in_a_comment_is_caught(raw: Config, raw_text: str) -> None:
    assert problems(raw, raw_text + f"\n# token: {generate_new_authentication_token()}\n")


def test_secret_detector_is_not_vacuous() -> None:
    assert secret_like(generate_new_authentication_token())
    assert secret_like(base64.b64encode(os.urandom(32)).decode() + "Aa1")
    assert secret_like("RAY_AUTH_TOKEN=hunter2 ray start --head")
    assert not secret_like('RAY_AUTH_TOKEN="$(cat ~/.ray/auth_token)" ray start --head')
    assert not secret_like("ami-0123456789abcdef0 /aws/service/deeplearning/ami/x86_64/latest")


# ---------------------------------------------------------------- broken copies


def _set(path: tuple[str, ...], value: Any) -> Callable[[Config], None]:
    def mutate(cfg: Config) -> None:
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _head_type(cfg: Config) -> Config:
    return cfg["available_node_types"][cfg["head_node_type"]]


def _worker_type(cfg: Config) -> Config:
    return next(iter(_worker_types(cfg).values()))


def _replace_in(key: str, old: str, new: str) -> Callable[[Config], None]:
    def mutate(cfg: Config) -> None:
        assert any(old in c for c in cfg[key]), (key, old)
        cfg[key] = [c.replace(old, new) for c in cfg[key]]

    return mutate


SCHEMA_BREAKS: dict[str, tuple[Callable[[Config], None], type[Exception]]] = {
    "max_workers is not an integer": (_set(("max_workers",), "many"), jsonschema.ValidationError),
    "unknown top-level field": (_set(("max_worker",), 4), jsonschema.ValidationError),
    "resource count is a string": (
        lambda c: _head_type(c)["resources"].update(GPU="0"),
        jsonschema.ValidationError,
    ),
    "head_node_type names no node type": (_set(("head_node_type",), "ray.head.gpu"), ValueError),
    "min_workers above max_workers": (lambda c: _worker_type(c).update(min_workers=9), ValueError),
}


@pytest.mark.parametrize("name", list(SCHEMA_BREAKS))
def test_ray_rejects_broken_copy(raw: Config, name: str) -> None:
    mutate, error = SCHEMA_BREAKS[name]
    broken = copy.deepcopy(raw)
    mutate(broken)
    with pytest.raises(error):
        ray_validate(broken)


PROPERTY_BREAKS: dict[str, Callable[[Config], None]] = {
    "head declares a GPU": lambda c: _head_type(c)["resources"].update(GPU=1),
    "head resource dropped": lambda c: _head_type(c)["resources"].pop(HEAD_RESOURCE),
    "worker declares no GPU": lambda c: _worker_type(c)["resources"].pop("GPU"),
    "head started without --num-gpus=0": _replace_in("head_start_ray_commands", " --num-gpus=0", ""),
    "head started with GPUs": _replace_in("head_start_ray_commands", "--num-gpus=0", "--num-gpus=8"),
    "worker start pins --num-gpus": _replace_in("worker_start_ray_commands", "--object-manager-port=8076",
                                                "--object-manager-port=8076 --num-gpus=8"),
    "worker GPU check dropped": lambda c: c.update(
        worker_start_ray_commands=[x for x in c["worker_start_ray_commands"] if "nvidia-smi" not in x]
    ),
    "build node declares a GPU": lambda c: c["available_node_types"]["ray.worker.cpu"]["resources"].update(GPU=8),
    "GPU node takes builds": lambda c: c["available_node_types"]["ray.worker.h100"]["resources"].update(
        {BUILD_RESOURCE: 8}
    ),
    "no build node type": lambda c: c["available_node_types"].pop("ray.worker.cpu"),
    "worker without RAY_AUTH_MODE": _replace_in("worker_start_ray_commands", "RAY_AUTH_MODE=token ", ""),
    "head without RAY_AUTH_MODE": _replace_in(
        "head_start_ray_commands", "RAY_AUTH_MODE=token", "RAY_AUTH_MODE=disabled"
    ),
    "literal token in a command": _replace_in(
        "worker_start_ray_commands",
        "RAY_AUTH_MODE=token",
        f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={generate_new_authentication_token()}",
    ),
    "token file kept in the repository": lambda c: c["file_mounts"].update(
        {DEFAULT_TOKEN_PATH: ".ray_token"}
    ),
    "no token file mount": lambda c: c["file_mounts"].pop(DEFAULT_TOKEN_PATH),
}


@pytest.mark.parametrize("name", list(PROPERTY_BREAKS))
def test_property_checks_catch_broken_copy(raw: Config, name: str) -> None:
    broken = copy.deepcopy(raw)
    PROPERTY_BREAKS[name](broken)
    ray_validate(broken)  # still a valid launcher config: only our own checks can catch these
    assert problems(broken), name
