"""ray_cluster.yaml against the JSON schema Ray ships; the example grids validate and expand."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import load_grid

REPO = Path(__file__).resolve().parents[3]


def test_ray_cluster_yaml_matches_rays_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    workers = [t for name, t in config["available_node_types"].items() if name != config["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) > 0 and t["resources"].get("accelerator_type:A100", 0) > 0
               for t in workers)
    assert any("pip install" in cmd and "kdeval" in cmd for cmd in config["setup_commands"])
    # the schema really rejects a broken config (the test can fail)
    broken = dict(config, available_node_types={"head": {"node_config": {}}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize("name, cells", [("demo.yaml", 8), ("smoke.yaml", 4), ("qwen2.5.yaml", 8),
                                         ("reasoning.yaml", 7), ("instructions.yaml", 14)])
def test_example_grids_validate(name, cells):
    grid, _ = load_grid(REPO / "examples" / name)
    assert len(expand(grid)) == cells
