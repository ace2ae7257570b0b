"""dvc.yaml → papermill → notebook, checked statically:

* params.yaml is the only source of values: a stage command passes only the foreach key (`model`,
  `vlm`), the notebook's parameters cell declares only that, and the notebook reads everything else
  through `stage_params(section)`, so a run outside DVC resolves the same config as `dvc repro`;
* dependencies are complete by construction: every biasaudit module a stage imports (transitively,
  tests/closure.py) is covered by a dep, and every params section its notebook reads is a params dep;
* every stage depends on the check stage, which validates params.yaml before DVC removes any output.
"""

import ast
import shlex

import jupytext
import pytest
import yaml
from papermill.cli import _resolve_type

from biasaudit.config import load_params
from biasaudit.params import Params

from .closure import closure_of_source, notebook_closure
from .conftest import ROOT

INSTANCE_KEYS = {"model": "models", "vlm": "vlms"}  # notebook parameter → the params table it indexes


def resolved_stages() -> dict[str, object]:
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        return {stage.addressing: stage for stage in repo.index.stages}


STAGES = resolved_stages()
NOTEBOOK_STAGES = sorted(a for a in STAGES if a != "check")


def parameters_cell(notebook_path) -> tuple[dict[str, type], dict[str, object]]:
    """(declared types, default values) of the notebook's cell tagged 'parameters'."""
    nb = jupytext.read(ROOT / notebook_path)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{notebook_path}: expected exactly one cell tagged 'parameters'"
    declared, defaults = {}, {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.AnnAssign), f"{notebook_path}: parameters must be annotated (name: type = value)"
        declared[node.target.id] = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
                                    "dict": dict}[ast.unparse(node.annotation).split("[")[0]]
        defaults[node.target.id] = ast.literal_eval(node.value)
    return declared, defaults


def passed_parameters(cmd: str) -> tuple[str, dict[str, object]]:
    args = shlex.split(cmd)
    assert args[0] == "scripts/run-notebook", f"stage must run through scripts/run-notebook: {cmd}"
    notebook, rest = args[1], args[3:]
    values, i = {}, 0
    while i < len(rest):
        flag = rest[i]
        if flag == "-p":
            values[rest[i + 1]] = _resolve_type(rest[i + 2])
            i += 3
        elif flag == "-r":
            values[rest[i + 1]] = rest[i + 2]
            i += 3
        elif flag == "-y":
            values.update(yaml.safe_load(rest[i + 1]))
            i += 2
        else:
            raise AssertionError(f"unexpected argument {flag!r} in {cmd}")
    return notebook, values


def stage_params_call(notebook_path) -> ast.Call:
    nb = jupytext.read(ROOT / notebook_path)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "stage_params"]
    assert len(calls) == 1, f"{notebook_path}: expected one stage_params(...) call"
    return calls[0]


def deps_of(stage) -> list[str]:
    return [str(d.def_path) for d in stage.deps if not hasattr(d, "params")]


def params_of(stage) -> set[str]:
    out = set()
    for d in stage.deps:
        if hasattr(d, "params"):
            out |= set(d.params or [])
    return out


def covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def test_every_stage_runs_a_notebook():
    assert NOTEBOOK_STAGES, "dvc.yaml defines no stages"
    for name in NOTEBOOK_STAGES:
        assert (ROOT / passed_parameters(STAGES[name].cmd)[0]).exists()


@pytest.mark.parametrize("stage", NOTEBOOK_STAGES)
def test_commands_pass_only_the_instance_key(stage):
    """params.yaml is the only source: the command passes at most the foreach key, the notebook
    declares at most that, and its default names an entry of params.yaml."""
    notebook, values = passed_parameters(STAGES[stage].cmd)
    declared, defaults = parameters_cell(notebook)
    assert set(values) <= set(INSTANCE_KEYS), f"{stage}: passes {sorted(set(values) - set(INSTANCE_KEYS))}"
    assert set(declared) <= set(INSTANCE_KEYS), f"{notebook}: parameters cell declares {sorted(declared)}"
    assert set(values) == set(declared), f"{stage}: passes {sorted(values)}, {notebook} declares {sorted(declared)}"
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, value in values.items():
        assert isinstance(value, declared[name]) and value in raw[INSTANCE_KEYS[name]], (stage, name, value)
        assert defaults[name] in raw[INSTANCE_KEYS[name]], f"{notebook}: default {name}={defaults[name]!r} not in params.yaml"
    call = stage_params_call(notebook)
    assert len(call.args) == 1 and not call.keywords, f"{notebook}: stage_params must take only the section name"


@pytest.mark.parametrize("stage", NOTEBOOK_STAGES)
def test_a_run_outside_dvc_reads_what_dvc_repro_reads(stage, in_repo):
    """Execute the notebook's parameters cell and its stage_params line twice — with the cell's
    defaults (a notebook opened by hand) and with what `dvc repro` injects — and compare the
    resolved configs with each other and with params.yaml."""
    notebook, injected = passed_parameters(STAGES[stage].cmd)
    _, defaults = parameters_cell(notebook)
    line = ast.unparse(stage_params_call(notebook))
    resolved = []
    for values in (defaults, {**defaults, **injected}):
        namespace = dict(values)
        exec("from biasaudit.notebook import stage_params\n_cfg, _section = " + line, namespace)
        resolved.append(namespace["_cfg"].model_dump())
    assert resolved[0] == resolved[1] == load_params(ROOT / "params.yaml").model_dump()


@pytest.mark.parametrize("stage", NOTEBOOK_STAGES)
def test_code_dependencies_are_the_import_closure(stage):
    """Every biasaudit module the stage's notebook reaches (imports inside functions included) is a
    dependency, so editing it makes this stage (and only its downstream) out of date."""
    notebook, _ = passed_parameters(STAGES[stage].cmd)
    deps = deps_of(STAGES[stage])
    assert notebook in deps, f"{stage}: the notebook is not a dependency"
    missing = sorted(str(p) for p in notebook_closure(ROOT / notebook) if not covered(str(p), deps))
    assert not missing, f"{stage}: dvc.yaml misses {missing}"


def test_check_stage_covers_its_closure():
    deps = deps_of(STAGES["check"])
    missing = sorted(str(p) for p in closure_of_source("import biasaudit.check") if not covered(str(p), deps))
    assert not missing and "params.yaml" in deps, missing


DERIVED = {"groups": "benchmarks.group_set", "group_colours": "benchmarks.group_set"}
MULTI = {"stand_ins": Params.STAND_IN_KEYS, "skipped": Params.SKIP_KEYS}  # a method reading several keys: every one of them a dependency


@pytest.mark.parametrize("stage", NOTEBOOK_STAGES)
def test_params_read_by_the_notebook_are_dependencies(stage):
    """A `cfg.<section>` the notebook reads is in the stage's params; a derived property counts as the key it
    derives from (the active group set's labels and colours: benchmarks.group_set)."""
    notebook, _ = passed_parameters(STAGES[stage].cmd)
    section = stage_params_call(notebook).args[0].value
    nb = jupytext.read(ROOT / notebook)
    tree = ast.parse("\n".join(c.source for c in nb.cells if c.cell_type == "code"))
    read = {section, "seed", "profile"} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                                           and getattr(n.value, "id", None) == "cfg" and n.attr != "model_dump"}
    params = params_of(STAGES[stage])
    for name in read:
        for key in MULTI.get(name, (DERIVED.get(name, name),)):
            assert any(p == key or p.startswith(key + ".") or key.startswith(p + ".") for p in params), \
                f"{stage}: reads cfg.{key}, not in params:"


@pytest.mark.parametrize("stage", NOTEBOOK_STAGES)
def test_every_stage_waits_for_the_check_stage(stage):
    assert "data/check/params.ok" in deps_of(STAGES[stage])


def test_external_inputs_of_each_stage_are_fingerprinted():
    """Folders and files named by parameters (sources.input_dir, a folder generator's folder and
    mapping CSV, …) are fingerprinted by the check stage; each stage depends on its fingerprint."""
    from biasaudit import contracts as C
    from biasaudit.check import external_inputs

    cfg = load_params(ROOT / "params.yaml")
    for key in external_inputs(cfg):
        base, _, instance = key.partition("_")
        if base in ("generate", "reflect") and instance:
            addresses = [f"{base}@{instance}"]
        else:
            addresses = [a for a in STAGES if a.split("@")[0] == key]
        assert addresses, f"no stage for fingerprint {key}"
        for address in addresses:
            assert C.inputs_fingerprint_path(key).as_posix() in deps_of(STAGES[address]), (address, key)


def test_stage_outputs_declare_executed_notebooks():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for name, stage in dvc["stages"].items():
        if name == "check":
            continue
        stage = stage.get("do", stage)  # foreach/matrix stages keep their definition under `do`
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])]
        assert any(str(o).startswith("reports/notebooks/") for o in outs), f"{name}: executed notebook not an output"
        deps = stage.get("deps", [])
        assert not any(str(d).startswith("reports/notebooks/") for d in deps), f"{name}: depends on an executed notebook"


def test_output_paths_follow_the_contracts():
    """Paths that are parameters appear in dvc.yaml as ${...} (or equal their default), others equal
    biasaudit.contracts."""
    from biasaudit import contracts as C

    outs = {str(o.def_path) for s in STAGES.values() for o in s.outs}
    cfg = load_params(ROOT / "params.yaml")
    for model in cfg.models:
        assert (C.IMAGES_DIR / model).as_posix() in outs or f"{cfg.generate.images_dir}/{model}" in outs
        for path in (C.labels_path(model), C.faces_path(model), C.embeddings_dir(model), C.overlays_dir(model)):
            assert path.as_posix() in outs, path
    for vlm in cfg.vlms:
        assert C.responses_path(vlm).as_posix() in outs
    for path in (C.BENCHMARKS_DIR, C.BASELINE_DIR, C.RELIABILITY_DIR, C.SOURCES_DIR, C.FOCUS_DIR, C.EDIT_CHECKS,
                 C.EDIT_CHECKS_REPORTS, C.CHECK_DIR):
        assert path.as_posix() in outs, path
    assert cfg.generate.prompts_file in outs


def test_params_file_is_valid(in_repo):
    load_params(ROOT / "params.yaml")


def test_source_dependencies_exist():
    """A dependency on code or reference data that no longer exists fails `dvc repro` late; catch it here."""
    missing = []
    for name, stage in STAGES.items():
        for dep in deps_of(stage):
            if dep.split("/")[0] in ("src", "notebooks", "scripts") or dep.startswith("data/reference"):
                if not (ROOT / dep).exists():
                    missing.append(f"{name}: {dep}")
    assert not missing, missing


def test_lock_holds_only_existing_stages():
    """`dvc repro` never drops the lock entry of a stage that dvc.yaml no longer defines; a stale entry misleads
    `dvc status` readers and every diff of the lock."""
    import yaml

    locked = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    assert sorted(set(locked) - set(STAGES)) == []


# Thresholds that only decide what a table flags or a page shows: changing one re-runs the stages that
# display it, never one that measures (faces, baseline, ...).
DISPLAY_THRESHOLDS = {"analyze.min_group_size": {"analyze", "report"}}


@pytest.mark.parametrize("key", sorted(DISPLAY_THRESHOLDS))
def test_a_display_threshold_reruns_only_the_stages_that_display_it(key):
    section, _, field = key.partition(".")
    staled = {name for name, stage in STAGES.items()
              if any(p in (key, section) for p in params_of(stage))}
    assert staled <= DISPLAY_THRESHOLDS[key] and "analyze" in staled, staled
    for name in set(NOTEBOOK_STAGES) - DISPLAY_THRESHOLDS[key]:  # and no other notebook reads it
        notebook, _ = passed_parameters(STAGES[name].cmd)
        reads = {ast.unparse(n) for n in ast.walk(ast.parse((ROOT / notebook).read_text(encoding="utf-8")))
                 if isinstance(n, ast.Attribute) and n.attr == field}
        assert not any(r.endswith(f"{section}.{field}") for r in reads), (name, key, reads)
