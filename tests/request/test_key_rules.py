"""request/deployment.py check_keys: the rule tables are matched first-match-wins, exactly as a scan of
fnmatch globs in order would (hypothesis over paths built from the tables' own words)."""

from __future__ import annotations

import fnmatch
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import InputError
from reshardctl.request import nemo_rl_config, verl_config
from reshardctl.request.deployment import READ, _matcher, check_keys, ignore, only

TABLES = {"nemo_rl": nemo_rl_config.RULES, "verl": verl_config.RULES}
WORDS = sorted({w for rules in TABLES.values() for pat, _ in rules for w in re.split(r"[.*?]", pat) if w}
               | {"x", "frob", "1"})
paths = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(".".join)


@pytest.mark.parametrize("name", sorted(TABLES))
@given(path=paths)
@settings(max_examples=400, deadline=None)
def test_the_combined_matcher_is_a_first_match_scan(name, path):
    rules = TABLES[name]
    m = _matcher(tuple(p for p, _ in rules)).fullmatch(path)
    scan = next((i for i, (p, _) in enumerate(rules) if fnmatch.fnmatchcase(path, p)), None)
    assert (int(m.lastgroup[1:]) if m else None) == scan


def test_every_table_path_is_decided_by_its_own_rule():
    for rules in TABLES.values():
        for i, (pat, _) in enumerate(rules):
            if "*" not in pat and "?" not in pat:
                first = next(j for j, (p, _) in enumerate(rules) if fnmatch.fnmatchcase(pat, p))
                assert first == i, (pat, rules[first][0])  # no earlier glob shadows an exact key


def test_check_keys_reads_ignores_and_refuses():
    rules = [("a.b", READ), ("a.c", only((1,), "c must be 1")), ("a.*", ignore("why"))]
    values = {"a.b": 5, "a.c": 1, "a.d": 2}
    assert check_keys(list(values.items()), rules, label="f.yaml", where=lambda p: "f.yaml",
                      resolve=values.get, framework="T") == 2
    bad = {"a.c": 2, "z": 3}
    with pytest.raises(InputError, match=r"f.yaml: 2 key\(s\) refused:\n  - f.yaml: `a.c` = 2: refused, c must be 1 "
                                         r"\(accepted: 1\)\n  - f.yaml: `z` = 3: not a key reshardctl reads for T"):
        check_keys(list(bad.items()), rules, label="f.yaml", where=lambda p: "f.yaml", resolve=bad.get, framework="T")
