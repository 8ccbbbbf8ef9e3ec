"""request/config_tree.py: NeMo RL's `defaults:` inheritance against an independent reference merge
(hypothesis), provenance per leaf, Hydra overrides, interpolation, and hostile inputs (cycles, missing
parents, oversized files, wrong types) refused with the file and the key."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import InputError
from reshardctl.request.config_tree import (
    MAX_BYTES, MAX_CHAIN, ConfigTree, apply_overrides, load_with_defaults, merge, tree_of,
)


def reference_merge(base: dict, over: dict) -> dict:
    """NeMo RL's merge_with_override + OmegaConf.merge, restated: a top-level mapping of `over` holding
    `_override_: true` replaces base's (marker dropped); `???` in `over` keeps base's value; mappings merge
    recursively; scalars and lists replace."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and value.get("_override_") is True:
            out.pop(key, None)
            value = {k: v for k, v in value.items() if k != "_override_"}
        out[key] = _ref_value(out.get(key, _ABSENT), value)
        if out[key] is _ABSENT:
            del out[key]
    return out


_ABSENT = object()


def _ref_value(old, new):
    if new == "???":
        return old
    if isinstance(new, dict) and isinstance(old, dict):
        merged = dict(old)
        for k, v in new.items():
            merged[k] = _ref_value(merged.get(k, _ABSENT), v)
            if merged[k] is _ABSENT:
                del merged[k]
        return merged
    return copy.deepcopy(new)


keys = st.sampled_from(["a", "b", "c", "tp", "pp", "policy"])
scalars = st.one_of(st.integers(-5, 5), st.sampled_from(["x", "y", "???"]), st.booleans(), st.none(),
                    st.lists(st.integers(0, 3), max_size=3))
trees = st.recursive(scalars, lambda inner: st.dictionaries(keys, inner, max_size=4), max_leaves=12)
mappings = st.dictionaries(keys, trees, max_size=4)




@given(base=mappings, over=mappings, mark=st.sets(keys, max_size=2))
@settings(max_examples=300, deadline=None)
def test_merge_equals_the_reference(base, over, mark):
    for k in mark:  # some top-level mappings of the child carry NeMo RL's _override_ marker
        if isinstance(over.get(k), dict):
            over[k] = {**over[k], "_override_": True}
    got = merge(tree_of(copy.deepcopy(base), "base.yaml"), tree_of(copy.deepcopy(over), "child.yaml"))
    assert got.data == reference_merge(base, over)
    # every leaf has an origin, and a leaf the child set (not ???) is the child's
    for path, value in got.leaves():
        assert got.where(path) in ("base.yaml", "child.yaml"), path
        if value != "???" and _get(over, path) == value and _get(base, path) != value:
            assert got.where(path) == "child.yaml", path


def _get(tree, path):
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    if isinstance(node, dict):
        node = {k: v for k, v in node.items() if k != "_override_"}
    return node


@given(a=mappings, b=mappings, c=mappings)
@settings(max_examples=100, deadline=None)
def test_files_with_defaults_merge_like_the_reference(tmp_path_factory, a, b, c):
    """child -> [p1, p2]: parents merged in order (the later wins), then the child over them."""
    d = tmp_path_factory.mktemp("cfg")
    (d / "sub").mkdir()
    (d / "p1.yaml").write_text(yaml.safe_dump(a))
    (d / "sub" / "p2.yaml").write_text(yaml.safe_dump(b))
    (d / "child.yaml").write_text(yaml.safe_dump({"defaults": ["p1.yaml", "sub/p2.yaml"], **c}))
    got = load_with_defaults(d / "child.yaml")
    assert got.data == reference_merge(reference_merge(reference_merge({}, a), b), c)


def test_provenance_names_the_file_that_set_each_value(tmp_path):
    (tmp_path / "base.yaml").write_text("policy:\n  tp: 1\n  pp: 1\ncluster: {n: 1}\n")
    (tmp_path / "mid.yaml").write_text("defaults: base.yaml\npolicy:\n  tp: 4\n")
    (tmp_path / "top.yaml").write_text("defaults: ./mid.yaml\ncluster:\n  _override_: true\n  m: 2\n")
    t = load_with_defaults(tmp_path / "top.yaml")
    assert t.data == {"policy": {"tp": 4, "pp": 1}, "cluster": {"m": 2}}
    assert (t.where("policy.tp"), t.where("policy.pp"), t.where("cluster.m")) == ("mid.yaml", "base.yaml", "top.yaml")


def test_a_parent_above_the_file_is_fine(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "root.yaml").write_text("x: 1\n")
    (tmp_path / "a" / "b" / "c.yaml").write_text("defaults: ../../root.yaml\ny: 2\n")
    assert load_with_defaults(tmp_path / "a" / "b" / "c.yaml").data == {"x": 1, "y": 2}


@pytest.mark.parametrize("files, start, says", [
    ({"a.yaml": "defaults: b.yaml\n", "b.yaml": "defaults: a.yaml\n"}, "a.yaml", r"`defaults` cycle: a.yaml -> b.yaml -> a.yaml"),
    ({"a.yaml": "defaults: [a.yaml]\n"}, "a.yaml", r"`defaults` cycle: a.yaml -> a.yaml"),
    ({"a.yaml": "defaults: nothere.yaml\n"}, "a.yaml", r"a.yaml: `defaults` names 'nothere.yaml', which does not exist"),
    ({"a.yaml": "defaults: 3\n"}, "a.yaml", r"a.yaml: `defaults` must be a path or a list of paths, got 3"),
    ({"a.yaml": "- 1\n- 2\n"}, "a.yaml", r"a.yaml: the top level must be a mapping, got list"),
    ({"a.yaml": "x: 1\nx: 2\n"}, "a.yaml", r"a.yaml: .*duplicate key 'x'"),
    ({"a.yaml": "x: &a [*a]\n"}, "a.yaml", r"a.yaml: "),
])
def test_hostile_defaults_are_refused_with_the_file(tmp_path, files, start, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=says):
        load_with_defaults(tmp_path / start)


def test_a_chain_deeper_than_the_bound_is_refused(tmp_path):
    for i in range(MAX_CHAIN + 2):
        (tmp_path / f"c{i}.yaml").write_text(f"defaults: c{i + 1}.yaml\n" if i <= MAX_CHAIN else "x: 1\n")
    with pytest.raises(InputError, match=rf"nested more than {MAX_CHAIN} files deep"):
        load_with_defaults(tmp_path / "c0.yaml")


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "1" * (MAX_BYTES + 10) + "\n")
    (tmp_path / "child.yaml").write_text("defaults: big.yaml\n")
    with pytest.raises(InputError, match=r"big.yaml: .*(bytes|limit)"):
        load_with_defaults(tmp_path / "child.yaml")


def test_a_special_file_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"null"):
        load_with_defaults("/dev/null")


def test_interpolations(tmp_path):
    (tmp_path / "a.yaml").write_text("p: {tp: 4, cp: 2}\nq: ${mul:${p.tp}, ${mul:2, ${p.cp}}}\nr: ${p.tp}\n"
                                     "s: x${p.tp}y\nbad: ${oc.env:HOME}\nmissing: ${p.nothere}\n")
    t = load_with_defaults(tmp_path / "a.yaml")
    assert (t.resolve("q"), t.resolve("r"), t.resolve("s")) == (16, 4, "x4y")
    with pytest.raises(InputError, match=r"a.yaml: `bad` = .*oc.env:HOME.* is not one reshardctl resolves"):
        t.resolve("bad")
    with pytest.raises(InputError, match=r"a.yaml: `missing` = .*`p.nothere` is not in the config"):
        t.resolve("missing")


def test_an_interpolation_cycle_is_bounded(tmp_path):
    (tmp_path / "a.yaml").write_text("x: ${y}\ny: ${x}\n")
    with pytest.raises(InputError, match=r"nested more than 16 deep"):
        load_with_defaults(tmp_path / "a.yaml").resolve("x")


def test_hydra_overrides():
    t = tree_of({"a": {"b": 1, "c": 2}, "d": 3}, "base.yaml")
    t = apply_overrides(t, [("a.b=5", "s.sh:1"), ("+a.e.f=[1,2]", "s.sh:2"), ("~d", "s.sh:3"),
                            ("++g='x y'", "s.sh:4")])
    assert t.data == {"a": {"b": 5, "c": 2, "e": {"f": [1, 2]}}, "g": "x y"}
    assert (t.where("a.b"), t.where("a.c"), t.where("a.e.f")) == ("s.sh:1", "base.yaml", "s.sh:2")
    with pytest.raises(InputError, match=r"s.sh:9: 'a b' is not a Hydra override"):
        apply_overrides(t, [("a b", "s.sh:9")])


def test_config_tree_queries():
    t = ConfigTree({"a": {"b": None}})
    assert t.has("a.b") and not t.has("a.c") and t.raw("a.c", 7) == 7 and t.resolve("a.b") is None
