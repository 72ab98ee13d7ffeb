"""FlashInfer-Bench's formats in and out (definitions, workloads, solutions, traces).

Both directions are tested twice: against upstream files kept in tests/data/flashinfer_bench (see
its README), which needs nothing installed, and against the real package's own models where it is
installed. CI installs it with

    pip install --no-deps flashinfer-bench==0.1.2 && pip install safetensors docstring-parser

(the package's other requirements, flashinfer-python and apache-tvm-ffi, are not needed to read
and write its data). Everything here is pure logic in process: no sandbox, no GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.taskspec.flashinfer_format import (
    ADAPTER_FILE,
    definition_problems,
    export_name,
    load_dataset,
    solution_from_dict,
    solution_from_json,
    solution_problems,
    solution_to_json,
    workload_from_trace,
)
from ksearch_ray.taskspec.flashinfer_traces import Environment, Evaluated, trace_records, write_dataset
from ksearch_ray.taskspec.spec import TaskError
from ksearch_ray.taskspec.task import Task, load_solution_dir, read_workloads

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tasks" / "flashinfer"
UPSTREAM = Path(__file__).resolve().parent / "data" / "flashinfer_bench"
GQA = "gqa_paged_decode_h32_kv4_d128_ps1"
ALL = sorted(p.name for p in TASKS.iterdir() if (p / "task.json").is_file())
ENV = Environment(hardware="NVIDIA H200", libs={"torch": "2.11.0"})


def _task(name: str) -> Task:
    return Task.load(TASKS / name)


def _every_solution(task: Task) -> list[Solution]:
    """Every bundled solution, the library baselines too (read from disk: flashinfer need not be installed)."""
    return [load_solution_dir(task.root / "solutions" / n, task.name) for n in task.solution_names(include_unavailable=True)]


def _timing(ms: float) -> Timing:
    return Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=10, wall_median_ms=ms, clock="cuda_events")


def _result(task: Task, solution: Solution, status: Status, per_workload: list[WorkloadResult]) -> EvalResult:
    return EvalResult(solution_id=solution.id, solution_name=solution.name, task=task.name, status=status,
                      workload_set="feedback", mode="fresh", device="cuda", device_name="NVIDIA H200",
                      workloads=per_workload, timed=True)


def _passed(task: Task, solution: Solution, ms: float) -> EvalResult:
    wls = task.workloads("feedback", "cuda")
    return _result(task, solution, Status.PASSED, [
        WorkloadResult(workload=w.name, status=Status.PASSED, max_abs_error=1e-3, max_rel_error=2e-3, timing=_timing(ms * (i + 1)))
        for i, w in enumerate(wls)])


# --- definitions and workloads ------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_bundled_definition_is_a_flashinfer_bench_definition_with_its_reference_and_tags(name):
    definition = json.loads((TASKS / name / "definition.json").read_text())
    assert definition_problems(definition) == []
    # The reference is the bundle's own reference solution, verbatim: one source of the math.
    assert definition["reference"] == (TASKS / name / "solutions" / "reference" / "main.py").read_text()
    assert any(t.startswith("fi_api:flashinfer.") for t in definition["tags"])
    assert name.startswith("gqa") or any(t in definition["tags"] for t in ("tp:8", "ep:8"))


@pytest.mark.parametrize("name", ALL)
def test_bundled_workload_files_are_flashinfer_bench_workload_traces(name):
    task = _task(name)
    for rel in task.definition.workload_sets.values():
        lines = [json.loads(line) for line in (task.root / rel).read_text().splitlines()]
        assert lines and all(r["definition"] == name and r["solution"] is None and r["evaluation"] is None for r in lines)
        assert [w.name for w in read_workloads(task.root / rel)] == [r["workload"]["uuid"] for r in lines]
        assert read_workloads(task.root / rel)[0] == workload_from_trace(lines[0])


def test_both_workload_shapes_read_the_same(tmp_path):
    trace = (TASKS / GQA / "workloads" / "feedback.jsonl").read_text().splitlines()[0]
    own = read_workloads(TASKS / GQA / "workloads" / "feedback.jsonl")[0]
    (tmp_path / "own.jsonl").write_text(own.model_dump_json() + "\n" + trace + "\n")
    a, b = read_workloads(tmp_path / "own.jsonl")
    assert a == b == own
    (tmp_path / "bad.jsonl").write_text('{"definition": "x", "workload": {"axes": {}}}\n')
    with pytest.raises(TaskError, match=r"bad.jsonl:1: not a FlashInfer-Bench workload"):
        read_workloads(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"reference": ""}, "reference is missing or empty"),
        ({"reference": "def forward(x):\n    return x\n"}, "no top-level run"),
        ({"outputs": {"q": {"shape": None, "dtype": "float32"}}}, "share a name"),
        ({"outputs": {"o": {"shape": ["nowhere"], "dtype": "float32"}}}, "undefined axis nowhere"),
        ({"constraints": ["len_indptr =="]}, "not a Python expression"),
    ],
)
def test_definition_problems_name_what_the_package_refuses(patch, fragment):
    definition = {**json.loads((TASKS / GQA / "definition.json").read_text()), **patch}
    assert any(fragment in p for p in definition_problems(definition))


def test_an_upstream_definition_becomes_a_bundle_whose_reference_agrees_with_ours(tmp_path):
    """The upstream definition (its own reference inside) and three of its workloads, as published."""
    from ksearch_ray.evaluation.compare import compare_outputs

    bundles = load_dataset(UPSTREAM, cache_dir=tmp_path / "cache")
    assert list(bundles) == [GQA]
    upstream, ours = Task.load(bundles[GQA]), _task(GQA)
    assert upstream.solution("reference").author == "flashinfer-bench"
    workloads = upstream.workloads("all", "cuda")
    assert len(workloads) == 3 and all(w.params["inputs"]["kv_indptr"]["type"] == "safetensors" for w in workloads)
    for w in workloads:  # blobs are never read: fresh page tables from the seed, for both
        inputs = upstream.generate_inputs(w, 5, "cpu")
        verdict = compare_outputs(upstream.reference(inputs), ours.reference(inputs), ours.definition.outputs,
                                  ours.definition.tolerance)
        assert verdict.status is Status.PASSED, verdict.message


# --- solutions ----------------------------------------------------------------------------------


def test_a_destination_passing_cuda_solution_is_imported_through_an_adapter_and_goes_back_as_it_came():
    task = _task(GQA)
    fixture = json.loads((UPSTREAM / "gqa_decode_cuda_dps.json").read_text())
    solution = solution_from_json(UPSTREAM / "gqa_decode_cuda_dps.json", task)
    # The adapter is Python: it builds the torch extension with the CUDA candidates' builder, then
    # allocates the outputs and calls run(*inputs, *outputs).
    assert solution.language == "python" and solution.entry_file == ADAPTER_FILE
    assert solution.sources["kernel.cu"] == fixture["sources"][0]["content"]
    assert '_TARGET_LANGUAGE = "cuda"' in solution.sources[ADAPTER_FILE]
    compile(solution.sources[ADAPTER_FILE], ADAPTER_FILE, "exec")
    back = solution_to_json(solution, task, target_hardware=["H200"])
    assert back["spec"] == {**fixture["spec"], "target_hardware": ["H200"]}
    assert back["sources"] == fixture["sources"] and back["author"] == fixture["author"]
    assert solution_from_dict(back, task).id == solution.id


@pytest.mark.parametrize("language", ["python", "triton"])
def test_destination_passing_python_and_triton_solutions_keep_their_language(language):
    task = _task(GQA)
    fib = {"name": "dps", "definition": GQA, "author": "someone",
           "spec": {"language": language, "target_hardware": ["cuda"], "entry_point": "k.py::kernel"},
           "sources": [{"path": "k.py", "content": "def kernel(*args):\n    pass\n"}]}
    solution = solution_from_dict(fib, task)
    assert solution.language == language and solution.entry_file == ADAPTER_FILE
    assert solution_to_json(solution, task, target_hardware="cuda")["spec"]["language"] == language


def test_a_cuda_solution_without_binding_is_read_as_tvm_ffi_and_refused_in_one_line():
    with pytest.raises(TaskError) as info:
        solution_from_json(UPSTREAM / "gqa_decode_cuda_no_binding.json", _task(GQA))
    message = str(info.value)
    assert "\n" not in message and "tvm-ffi binding" in message and "spec.binding is absent" in message
    assert '"binding": "torch"' in message


def test_exported_names_are_unique_across_definitions_and_stable():
    names = [export_name(t.solution("reference"), t) for t in map(_task, ALL)]
    assert len(set(names)) == len(ALL) and all(n.startswith(t) for n, t in zip(names, ALL, strict=True))
    task = _task(GQA)
    seed = task.solution("triton_seed")
    assert export_name(seed, task) == export_name(seed, task)
    variant = Solution(**{**seed.model_dump(), "sources": {**seed.sources, "main.py": seed.sources["main.py"] + "\n"}})
    assert export_name(variant, task) != export_name(seed, task)  # same name, other code: another name


def test_export_mends_an_empty_author_or_file_and_refuses_nothing_the_package_accepts():
    task = _task(GQA)
    seed = task.solution("triton_seed")
    odd = Solution(**{**seed.model_dump(), "author": "", "sources": {**seed.sources, "helpers.py": ""}})
    payload = solution_to_json(odd, task, target_hardware="H200")
    assert payload["author"] == "unknown" and {s["path"]: s["content"] for s in payload["sources"]}["helpers.py"] == "\n"
    assert solution_problems(payload) == []
    bad = {**payload, "author": "", "spec": {**payload["spec"], "entry_point": "main.py"},
           "sources": [{"path": "../x.py", "content": ""}]}
    problems = " | ".join(solution_problems(bad))
    for fragment in ("author is empty", "not 'file::function'", "leaves the solution", "source ../x.py is empty"):
        assert fragment in problems


# --- traces -------------------------------------------------------------------------------------


def test_an_evaluation_becomes_one_trace_per_workload_with_the_baseline_as_reference():
    task = _task(GQA)
    seed, ref = task.solution("triton_seed"), task.solution("reference")
    result, base = _passed(task, seed, 0.1), _passed(task, ref, 1.0)
    records = trace_records(task, "the_seed", result, baseline=base, environment=ENV, when=0.0)
    assert [r["workload"]["uuid"] for r in records] == [w.name for w in task.workloads("feedback", "cuda")]
    first = records[0]
    assert first["definition"] == GQA and first["solution"] == "the_seed"
    assert first["evaluation"]["performance"] == {"latency_ms": 0.1, "reference_latency_ms": 1.0, "speedup_factor": 10.0}
    assert first["evaluation"]["correctness"] == {"max_relative_error": 2e-3, "max_absolute_error": 1e-3}
    assert first["evaluation"]["environment"] == {"hardware": "NVIDIA H200", "libs": {"torch": "2.11.0"}}
    assert first["evaluation"]["timestamp"].startswith("1970-01-01T00:00:00")


def test_statuses_the_package_lacks_become_runtime_errors_that_say_so_and_untimed_passes_are_left_out():
    task = _task(GQA)
    seed = task.solution("triton_seed")
    names = [w.name for w in task.workloads("feedback", "cuda")]
    crashed = _result(task, seed, Status.CRASHED, [
        WorkloadResult(workload=names[0], status=Status.PASSED, max_abs_error=0.0, max_rel_error=0.0),  # untimed
        WorkloadResult(workload=names[1], status=Status.CRASHED, message="segfault")])
    records = trace_records(task, "s", crashed, environment=ENV, when=0.0)
    assert len(records) == 1 and records[0]["evaluation"]["status"] == "RUNTIME_ERROR"
    assert records[0]["evaluation"]["log"] == "ksearch-ray status CRASHED: segfault"
    assert "correctness" not in records[0]["evaluation"] and "performance" not in records[0]["evaluation"]
    build = _result(task, seed, Status.COMPILE_ERROR, [])
    assert [r["evaluation"]["status"] for r in trace_records(task, "s", build, environment=ENV, when=0.0)] == ["COMPILE_ERROR"] * 5
    wrong = _result(task, seed, Status.INCORRECT_NUMERICAL, [
        WorkloadResult(workload=names[0], status=Status.INCORRECT_NUMERICAL, max_abs_error=math.inf, max_rel_error=None)])
    (record,) = trace_records(task, "s", wrong, environment=ENV, when=0.0)
    correctness = record["evaluation"]["correctness"]
    assert correctness["max_absolute_error"] == math.inf and math.isnan(correctness["max_relative_error"])


def test_a_dataset_of_exports_is_laid_out_as_a_trace_set_and_written_once(tmp_path):
    tasks = [_task(n) for n in ALL]
    gqa = tasks[ALL.index(GQA)]
    seed = gqa.solution("triton_seed")
    evaluated = [(gqa, Evaluated("baseline", gqa.solution("reference"), _passed(gqa, gqa.solution("reference"), 1.0), 0.0)),
                 (gqa, Evaluated("evaluation", seed, _passed(gqa, seed, 0.5), 1.0))]
    counts = write_dataset(tmp_path / "ds", tasks, solutions=[(t, s) for t in tasks for s in _every_solution(t)],
                           evaluated=evaluated, environment=ENV, target_hardware="H200")
    assert counts == {"definitions": 4, "workloads": sum(len(_task(n).workloads("all", "cuda")) for n in ALL),
                      "solutions": sum(len(_every_solution(t)) for t in tasks), "traces": 10}
    op = json.loads((TASKS / GQA / "definition.json").read_text())["op_type"]
    lines = (tmp_path / "ds" / "traces" / op / f"{GQA}.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["evaluation"]["performance"]["speedup_factor"] == pytest.approx(2.0)
    with pytest.raises(TaskError, match="not empty"):
        write_dataset(tmp_path / "ds", tasks)


def test_export_traces_writes_a_run_as_a_dataset(tmp_path):
    """`ksearch export RUN_DIR --traces DIR` on a run directory written through the run store."""
    from typer.testing import CliRunner

    from ksearch_ray.cli import app
    from ksearch_ray.events import Baseline, Evaluation, Seed
    from ksearch_ray.store import RunStore

    task = _task(GQA)
    ref, seed = task.solution("reference"), task.solution("triton_seed")
    store = RunStore.create(tmp_path / "run", {"config": {"task": GQA}, "task_root": str(task.root),
                                               "versions": {"torch": "2.11.0"}})
    for sol in (ref, seed):
        store.save_solution(sol)
    store.append(Baseline(solution_id=ref.id, evaluator=0, gpu="NVIDIA H200", result=_passed(task, ref, 1.0)))
    store.append(Seed(solution_id=seed.id, evaluator=0, gpu="NVIDIA H200", result=_passed(task, seed, 0.5)))
    store.append(Evaluation(round=1, evaluator=0, solution_id=seed.id, result=_passed(task, seed, 0.25)))
    store.append(Evaluation(round=2, evaluator=0, solution_id="0" * 16, result=_passed(task, seed, 9.0)))  # no code kept
    store.close()
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--traces", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    traces = list((tmp_path / "ds" / "traces").rglob("*.jsonl"))
    assert len(traces) == 1 and len(traces[0].read_text().splitlines()) == 15
    assert len(list((tmp_path / "ds" / "solutions").rglob("*.json"))) == 2
    again = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--traces", str(tmp_path / "ds")])
    assert again.exit_code == 2 and "not empty" in again.output
    wrong = CliRunner().invoke(app, ["export", str(task.root / "solutions" / "reference"), "--traces", str(tmp_path / "x")])
    assert wrong.exit_code == 2 and "not a run directory" in wrong.output


# --- against the package itself -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fib():
    return pytest.importorskip("flashinfer_bench.data", reason="flashinfer-bench is not installed (see this file's docstring)")


def test_the_package_reads_every_bundled_definition_and_workload(fib):
    for name in ALL:
        definition = fib.Definition.model_validate_json((TASKS / name / "definition.json").read_text())
        assert definition.name == name and definition.reference
        task = _task(name)
        for rel in task.definition.workload_sets.values():
            traces = fib.load_jsonl_file(fib.Trace, task.root / rel)
            assert traces and all(t.is_workload_trace() for t in traces)


def test_the_package_reads_every_export_and_a_dataset_of_them_with_traces(fib, tmp_path):
    tasks = [_task(n) for n in ALL]
    everything = [(t, s) for t in tasks for s in _every_solution(t)]
    for task, solution in everything:
        fib.Solution.model_validate(solution_to_json(solution, task, target_hardware="H200"))
    dps = solution_from_json(UPSTREAM / "gqa_decode_cuda_dps.json", tasks[ALL.index(GQA)])
    gqa = tasks[ALL.index(GQA)]
    seed = gqa.solution("triton_seed")
    names = [w.name for w in gqa.workloads("feedback", "cuda")]
    failed = _result(gqa, seed, Status.INCORRECT_NUMERICAL, [
        WorkloadResult(workload=names[0], status=Status.INCORRECT_NUMERICAL, max_abs_error=math.inf, max_rel_error=None)])
    evaluated = [(gqa, Evaluated("baseline", gqa.solution("reference"), _passed(gqa, gqa.solution("reference"), 1.0), 0.0)),
                 (gqa, Evaluated("evaluation", seed, _passed(gqa, seed, 0.5), 1.0)),
                 (gqa, Evaluated("evaluation", seed, failed, 2.0)),
                 (gqa, Evaluated("evaluation", dps, _result(gqa, dps, Status.COMPILE_ERROR, []), 3.0))]
    write_dataset(tmp_path / "ds", tasks, solutions=everything, evaluated=evaluated, environment=ENV)
    trace_set = fib.TraceSet.from_path(str(tmp_path / "ds"))
    assert set(trace_set.definitions) == set(ALL)
    assert sum(len(v) for v in trace_set.solutions.values()) == len(everything) + 1
    assert sum(len(v) for v in trace_set.workloads.values()) == sum(len(t.workloads("all", "cuda")) for t in tasks)
    statuses = [t.evaluation.status.value for t in trace_set.traces[GQA]]
    assert statuses.count("PASSED") == 10 and statuses.count("INCORRECT_NUMERICAL") == 1 and statuses.count("COMPILE_ERROR") == 5
    best = trace_set.get_best_trace(GQA)
    assert best is not None and best.solution == export_name(seed, gqa)
    assert trace_set.get_solution(export_name(dps, gqa)).spec.destination_passing_style is True


def test_what_the_package_writes_is_read_back(fib, tmp_path):
    """The other direction through the package's own models and writers: its JSON in, as users make it."""
    task = _task(GQA)
    fixture = json.loads((UPSTREAM / "gqa_decode_cuda_dps.json").read_text())
    theirs = fib.Solution.model_validate(fixture)
    path = tmp_path / "theirs.json"
    fib.save_json_file(theirs, path)
    solution = solution_from_json(path, task)
    assert solution.entry_file == ADAPTER_FILE and solution.sources["kernel.cu"] == fixture["sources"][0]["content"]
    defaults = fib.Solution.model_validate({**fixture, "spec": {k: v for k, v in fixture["spec"].items()
                                                                if k not in ("binding", "destination_passing_style")}})
    fib.save_json_file(defaults, path)  # the package's defaults, as it writes them: DPS, tvm-ffi
    with pytest.raises(TaskError, match="tvm-ffi binding"):
        solution_from_json(path, task)
    definition = fib.Definition.model_validate_json((UPSTREAM / f"{GQA}.json").read_text())
    (tmp_path / "ds" / "definitions").mkdir(parents=True)
    fib.save_json_file(definition, tmp_path / "ds" / "definitions" / f"{GQA}.json")
    fib.save_jsonl_file(fib.load_jsonl_file(fib.Trace, UPSTREAM / f"{GQA}.jsonl"), tmp_path / "ds" / "workloads" / f"{GQA}.jsonl")
    bundle = Task.load(load_dataset(tmp_path / "ds", cache_dir=tmp_path / "cache")[GQA])
    assert len(bundle.workloads("all", "cuda")) == 3 and bundle.solution("reference").author == "flashinfer-bench"


def test_a_cpu_run_exports_a_dataset_that_holds_every_workload_its_traces_name_and_no_zero_measurements(fib, tmp_path):
    """Traces of a run on the CPU path name the reduced `-cpu` workloads: the workloads file holds them
    too; the baseline's own traces compare it with itself; a workload without a baseline timing gets
    no reference figures rather than zeros."""
    task = _task(GQA)
    ref, seed = task.solution("reference"), task.solution("triton_seed")
    cpu = task.workloads("feedback-cpu", "cpu")

    def on_cpu(solution: Solution, ms: float, timed: int) -> EvalResult:
        return _result(task, solution, Status.PASSED, [
            WorkloadResult(workload=w.name, status=Status.PASSED, max_abs_error=1e-3, max_rel_error=2e-3,
                           timing=_timing(ms) if i < timed else None) for i, w in enumerate(cpu)
        ]).model_copy(update={"workload_set": "feedback-cpu", "device": "cpu"})

    evaluated = [(task, Evaluated("baseline", ref, on_cpu(ref, 4.0, timed=1), 0.0)),
                 (task, Evaluated("evaluation", seed, on_cpu(seed, 2.0, timed=len(cpu)), 1.0))]
    write_dataset(tmp_path / "ds", [task], evaluated=evaluated, environment=ENV, target_hardware="CPU")
    trace_set = fib.TraceSet.from_path(str(tmp_path / "ds"))
    op = json.loads((TASKS / GQA / "definition.json").read_text())["op_type"]
    workloads = {json.loads(line)["workload"]["uuid"]
                 for line in (tmp_path / "ds" / "workloads" / op / f"{GQA}.jsonl").read_text().splitlines()}
    traces = [json.loads(line) for line in (tmp_path / "ds" / "traces" / op / f"{GQA}.jsonl").read_text().splitlines()]
    assert {t["workload"]["uuid"] for t in traces} <= workloads and {w.name for w in cpu} <= workloads
    performance = [(t["solution"], t["evaluation"]["performance"]) for t in traces]
    reference = [p for name, p in performance if name == export_name(ref, task)]
    assert reference == [{"latency_ms": 4.0, "reference_latency_ms": 4.0, "speedup_factor": 1.0}]
    candidate = [p for name, p in performance if name == export_name(seed, task)]
    assert candidate[0] == {"latency_ms": 2.0, "reference_latency_ms": 4.0, "speedup_factor": 2.0}
    assert all(p == {"latency_ms": 2.0} for p in candidate[1:]) and len(candidate) == len(cpu)
    assert trace_set.definitions[GQA].name == GQA


def test_one_rule_says_which_runs_export_a_task_that_is_not_a_flashinfer_bench_definition_is_refused(tmp_path):
    from typer.testing import CliRunner

    from ksearch_ray.cli import app

    trimul = Task.load(TASKS.parent / "trimul")
    done = CliRunner().invoke(app, ["export", str(trimul.root / "solutions" / "triton_seed"), "--task", "trimul",
                                    "--out", str(tmp_path / "s.json")])
    assert done.exit_code == 2 and "trimul is not a FlashInfer-Bench definition" in done.output, done.output
    assert not (tmp_path / "s.json").exists()


def _blob_inputs(record: dict) -> dict[str, dict]:
    return {name: spec for name, spec in record["workload"]["inputs"].items() if spec["type"] == "safetensors"}


def test_every_blob_an_exported_workload_or_trace_names_is_inside_the_dataset_and_loads(fib, tmp_path):
    """The bundled workloads name FlashInfer-Bench's recorded blobs, which are not shipped. An export
    writes its own (the page tables and MoE routing the evaluator draws for the export's seed) inside
    the dataset, so every workload and trace resolves there, with the definition's shapes and dtypes
    as the package's loader checks them."""
    import torch
    from flashinfer_bench.bench.utils import load_safetensors

    tasks = [_task(n) for n in ALL]
    gqa = tasks[ALL.index(GQA)]
    seed = gqa.solution("triton_seed")
    evaluated = [(gqa, Evaluated("baseline", gqa.solution("reference"), _passed(gqa, gqa.solution("reference"), 1.0), 0.0)),
                 (gqa, Evaluated("evaluation", seed, _passed(gqa, seed, 0.5), 1.0))]
    out = tmp_path / "ds"
    write_dataset(out, tasks, evaluated=evaluated, environment=ENV, target_hardware="H200")
    trace_set = fib.TraceSet.from_path(str(out))
    records = [json.loads(line) for f in sorted((out / "workloads").rglob("*.jsonl")) + sorted((out / "traces").rglob("*.jsonl"))
               for line in f.read_text().splitlines()]
    named = [(r, spec) for r in records for spec in _blob_inputs(r).values()]
    assert named and {r["definition"] for r, _ in named} == set(ALL)
    for _record, spec in named:
        path = (out / spec["path"]).resolve()
        assert path.is_file() and path.is_relative_to(out.resolve()), spec["path"]
    for record in records:
        if _blob_inputs(record):
            workload = fib.Workload.model_validate(record["workload"])
            load_safetensors(trace_set.definitions[record["definition"]], workload, out)  # shapes and dtypes
    # The blob is the evaluator's own draw for that seed: what `synthesize` makes for the same workload.
    from ksearch_ray.taskspec.flashinfer_inputs import synthesize
    from ksearch_ray.taskspec.flashinfer_traces import BLOB_SEED

    smallest = min((w for w in gqa.workloads("feedback", "cuda")), key=lambda w: w.axes["num_pages"])
    record = next(r for r in records if r["workload"]["uuid"] == smallest.name)
    blob = load_safetensors(trace_set.definitions[GQA], fib.Workload.model_validate(record["workload"]), out)
    drawn = synthesize(json.loads((TASKS / GQA / "definition.json").read_text()), smallest, BLOB_SEED, "cpu")
    for name in ("kv_indptr", "kv_indices"):
        assert torch.equal(blob[name], drawn[name])
