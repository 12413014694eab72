"""A metric from an installed package (entry-point group kdeval.metrics): registered under its name, scoring a
file task, its source in the identity of the cells it scores; a wrong one is one line naming it."""
from __future__ import annotations

import json

import pytest

from kdeval.cluster import plugins
from kdeval.evals.metrics import registry

METRIC = '''
def first_word(prediction, references):
    """1 when the prediction's first word is an answer."""
    words = prediction.split()
    return float(bool(words) and words[0].strip(".,") in references)
'''


def install(site, source=METRIC, name="first_word", target="first_word"):
    """A distribution in ``site`` as pip leaves it: the module and its dist-info with the entry point."""
    (site / "mymetric.py").write_text(source)
    info = site / "mymetric-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymetric\nVersion: 0.1\n")
    (info / "top_level.txt").write_text("mymetric\n")
    (info / "entry_points.txt").write_text(f"[kdeval.metrics]\n{name} = mymetric:{target}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in list(plugins._METRICS):
        registry.unregister_metric(name)
        plugins._METRICS.pop(name)
    import sys
    sys.modules.pop("mymetric", None)


def _grid(tmp_path, metric):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"context": "c", "question": "q?", "answer": "yes"}) + "\n")
    from kdeval.jobs.grid.load import validate_mapping

    return validate_mapping({"name": "m", "models": ["stub:0.1"], "policies": ["keydiff"], "budgets": [64],
                             "chunk_sizes": [32], "tasks": [{"name": "file", "params": {"path": str(data),
                                                                                       "metric": metric}}]}, "grid")


def test_an_installed_metric_scores_a_file_task_and_enters_the_cell_identity(site, tmp_path):
    from kdeval.evals import get_spec
    from kdeval.jobs.grid.cells import expand

    install(site)
    (spec,) = plugins.load_metric_entry_points()
    assert spec.ref == "kdeval.metrics:first_word" and spec.version == "mymetric 0.1"
    assert registry.ORIGINS["first_word"] == "entry point kdeval.metrics:first_word (mymetric 0.1)"
    task = get_spec("file").build(path=str(_write(tmp_path)), metric="first_word")
    assert task.score("Yes, indeed", ["Yes"], {}).score == 1.0 and task.score("no", ["Yes"], {}).score == 0.0
    before = expand(_grid(tmp_path, "first_word"))[0]
    builtin = expand(_grid(tmp_path, "string_match_part"))[0]
    install(site, METRIC.replace('strip(".,")', 'strip(".,!")'))  # an edit of the metric
    plugins.load_metric_entry_points()
    after = expand(_grid(tmp_path, "first_word"))[0]
    assert after.task.data_digest != before.task.data_digest and after.id != before.id
    assert expand(_grid(tmp_path, "string_match_part"))[0].id == builtin.id  # other cells untouched


def _write(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"context": "c", "question": "q?", "answer": "Yes"}) + "\n")
    return path


def test_a_metric_of_the_wrong_shape_or_name_is_one_line(site):
    install(site, "def first_word(prediction, references):\n    return 'yes'\n")
    with pytest.raises(plugins.PluginError, match=r"^entry point kdeval.metrics:first_word: expected a function "
                                                  r"\(prediction, references\) -> a score in \[0, 1\], got function "
                                                  r"giving 'yes'$"):
        plugins.load_metric_entry_points()
    import sys
    sys.modules.pop("mymetric", None)
    install(site, METRIC.replace("def first_word", "def qa_f1"), name="qa_f1", target="qa_f1")
    with pytest.raises(plugins.PluginError, match="metric name 'qa_f1' is already taken by the built-in metric"):
        plugins.load_metric_entry_points()
