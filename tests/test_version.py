"""The code versions: the whole package's (provenance) and a cell's result code (identity)."""
import shutil
from pathlib import Path

import kdeval
from kdeval.jobs.grid.cells import cell_code_version, kdeval_version
from kdeval.version import code_version, result_code_files, result_code_hash, source_hash, tree_hash


def test_source_hash_changes_with_any_source_file(tmp_path):
    pkg = Path(kdeval.__file__).parent
    copy = tmp_path / "kdeval"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_hash(copy) == tree_hash(pkg) == source_hash()
    (copy / "cli" / "app.py").write_text((copy / "cli" / "app.py").read_text() + "\n# changed\n")
    assert tree_hash(copy) != tree_hash(pkg)


def test_result_code_is_engine_tasks_execution_and_the_policys_own_modules(tmp_path):
    every = ["keydiff/policy/keydiff.py", "baselines/snapkv.py", "baselines/sink.py"]
    files = result_code_files(["baselines/snapkv.py"], every)
    assert "baselines/snapkv.py" in files and "keydiff/engine.py" in files and "evals/benchmarks/needle.py" in files
    assert "cluster/execute.py" in files
    assert not {"keydiff/policy/keydiff.py", "baselines/sink.py"} & set(files)  # other policies' modules
    assert not [f for f in files if f.startswith(("cli/", "jobs/", "storage/"))]
    copy = tmp_path / "kdeval"
    shutil.copytree(Path(kdeval.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = result_code_hash(["baselines/snapkv.py"], every, root=copy)
    (copy / "jobs" / "scheduler.py").write_text("# rewritten\n")
    assert result_code_hash(["baselines/snapkv.py"], every, root=copy) == before
    (copy / "baselines" / "sink.py").write_text("# rewritten\n")
    assert result_code_hash(["baselines/snapkv.py"], every, root=copy) == before
    (copy / "baselines" / "snapkv.py").write_text("# rewritten\n")
    assert result_code_hash(["baselines/snapkv.py"], every, root=copy) != before


def test_runs_record_the_package_version_and_cells_their_result_code():
    assert kdeval_version() == code_version() == f"{kdeval.__version__}+{source_hash()}"
    assert len(code_version()) <= 32 and len(cell_code_version("snapkv")) <= 32
    assert cell_code_version("snapkv") != cell_code_version("keydiff")
    assert cell_code_version("keydiff") == cell_code_version("keydiff-sw")  # one module


def test_a_wrapping_policy_hashes_its_inner_policys_code_too():
    from kdeval.cluster import catalog

    assert catalog.policy_source_files("chunkkv") == ["baselines/chunkkv.py", "baselines/wrapping.py",
                                                      "keydiff/policy/keydiff.py"]
    assert catalog.policy_source_files("chunkkv", {"inner": "snapkv"}) == ["baselines/chunkkv.py",
                                                                          "baselines/snapkv.py",
                                                                          "baselines/wrapping.py"]
    assert cell_code_version("chunkkv", {"inner": "snapkv"}) != cell_code_version("chunkkv")


def test_the_stub_workload_is_hashed_into_stub_cells_only():
    every = ["baselines/snapkv.py"]
    assert "cluster/stub.py" not in result_code_files(["baselines/snapkv.py"], every)
    assert "cluster/stub.py" in result_code_files(["baselines/snapkv.py"], every, stub=True)
    assert "baselines/registry.py" in result_code_files(["baselines/snapkv.py"], every)  # every cell looks it up
    assert cell_code_version("keydiff", stub=True) != cell_code_version("keydiff")
