"""The code version in cell ids follows the package source."""
import shutil
from pathlib import Path

import kdeval
from kdeval.jobs.cells import kdeval_version
from kdeval.version import code_version, source_hash, tree_hash


def test_source_hash_changes_with_any_source_file(tmp_path):
    pkg = Path(kdeval.__file__).parent
    copy = tmp_path / "kdeval"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_hash(copy) == tree_hash(pkg) == source_hash()
    (copy / "keydiff" / "keydiff.py").write_text((copy / "keydiff" / "keydiff.py").read_text() + "\n# changed\n")
    assert tree_hash(copy) != tree_hash(pkg)


def test_cell_ids_use_release_and_source_hash():
    assert kdeval_version() == code_version() == f"{kdeval.__version__}+{source_hash()}"
    assert len(code_version()) <= 32
