"""Every built-in policy is reachable from ``kdeval.baselines`` (the registry of every policy, KeyDiff's included),
and ``kdeval.keydiff`` stays below it: importing it imports no baseline and offers no lookup.

Each check runs in a fresh interpreter: this one has imported ``kdeval.baselines`` long ago.
"""
import json
import subprocess
import sys

BUILTIN = {"full", "keydiff", "keydiff-mean", "keydiff-pairwise", "keydiff-sw", "sink", "tova", "h2o", "snapkv",
           "knorm", "random", "lagkv", "chunkkv", "expected-attention", "sink-rerotate", "pyramidkv",
           "ada", "ada-keydiff", "ada-snapkv", "criticalkv", "criticaladakv", "cur", "leverage", "compactor",
           "finch", "think", "merging", "kvzip", "cam"}


def fresh(code: str) -> dict | list:
    """Run ``code`` in a new interpreter; it prints one JSON value as its last line."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_builtin_set_is_what_the_baselines_package_registers():
    """In a fresh interpreter: tests may register policies of their own (the nightly probe does) into this one."""
    got = fresh("import json\nfrom kdeval.baselines import policy_names\nprint(json.dumps(policy_names()))\n")
    assert set(got) == BUILTIN


def test_import_keydiff_does_not_import_baselines():
    got = fresh(
        "import json, sys\n"
        "import kdeval.keydiff\n"
        "import kdeval.keydiff.policy.registry\n"
        "before = sorted(m for m in sys.modules if m.startswith('kdeval.baselines'))\n"
        "print(json.dumps({'before': before, 'lookup': hasattr(kdeval.keydiff, 'get_policy')}))\n"
    )
    assert got == {"before": [], "lookup": False}


def test_get_policy_builds_every_builtin_from_a_fresh_interpreter():
    got = fresh(
        "import json\n"
        "from kdeval.baselines import describe, get_policy, list_policies, policy_names\n"
        "names = policy_names()\n"
        "built = {n: type(get_policy(n)).name for n in names}\n"
        "print(json.dumps({'names': names, 'built': built, 'listed': [p.name for p in list_policies()],\n"
        "                  'snapkv_window': describe('snapkv').to_dict()['params'][0]}))\n"
    )
    assert set(got["names"]) == BUILTIN
    assert got["built"] == {n: n for n in got["names"]}
    assert got["listed"] == got["names"]
    assert got["snapkv_window"] == {"name": "window", "type": "int", "default": 32}


def test_unknown_name_lists_the_baselines_too():
    got = fresh(
        "import json\n"
        "from kdeval.baselines import UnknownPolicyError, get_policy\n"
        "try:\n"
        "    get_policy('snapvk')\n"
        "except UnknownPolicyError as e:\n"
        "    print(json.dumps({'msg': str(e)}))\n"
    )
    assert got["msg"].startswith("policy: unknown name 'snapvk'")
    assert "snapkv" in got["msg"] and "h2o" in got["msg"]
