"""Before/after check of a planner speed change: `reshardctl plan --json` of this checkout and of another
source tree (``--base``, e.g. ``git archive <commit> | tar -x -C /tmp/base``) must be identical on every
case apart from the ``planning_s`` timings (fingerprints, predictions, the m2n report, compare rows).

    .venv/bin/python benchmarks/plan_identity.py --base /tmp/base
    .venv/bin/python benchmarks/plan_identity.py --base /tmp/base --fingerprints-changed
        # a change of the fingerprint's encoding on purpose: every fingerprint must differ (the plans
        # are not compared by them), everything else must be identical
    .venv/bin/python benchmarks/plan_identity.py --base /tmp/base --added gpu_memory
        # a key the report gains on purpose: left out of this tree's JSON (a base that has it differs)
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
from pathlib import Path

from plan_scale import OTHER_TREE

CASES = [
    "--model deepseek-v3 --site dgx-h100 --train pp=16,ep=16,first=3,last=2 --infer tp=32,dp=8",
    "--model deepseek-v3 --site dgx-h100 --train pp=16,ep=16,first=3,last=2 --infer tp=32,dp=8"
    " --compare-infer tp=32,dp=8 --compare-infer tp=16,dp=16 --compare-infer tp=64,dp=4",
    "--model deepseek-v3 --site dgx-h100 --train pp=16,ep=4,first=3,last=2 --infer tp=8,dp=8 --relay off",
    "--model qwen3-235b-a22b --site dgx-h100 --train tp=4,pp=2,ep=8,etp=1,dp=8 --infer tp=8,dp=8",
    "--model llama-3.1-70b --site dgx-h100 --train tp=8,pp=8 --infer tp=8,dp=8 --bucket-mb 64",
    "--model llama-3.1-70b --site dgx-h100 --train tp=8,pp=8 --infer tp=8,dp=8 --transport gather_broadcast"
    " --compare-infer tp=8,dp=8 --compare-infer tp=16,dp=4",
    "",
    "--model qwen3-235b-a22b --layers 4 --site local --train tp=2,ep=2,etp=1 --infer tp=2,dp=2 --relay off"
    " --compare-infer tp=4",
    # heavy-pair phases (several rounds per phase); small buckets (first fit, split instances)
    "--model deepseek-v3 --site dgx-h100 --train pp=16,ep=16,first=3,last=2 --infer tp=16,dp=16 --transport reshard",
    "--model deepseek-v3 --site dgx-h100 --train pp=16,ep=16,first=3,last=2 --infer tp=32,dp=8 --bucket-mb 16"
    " --transport reshard",
    "--model llama-3.1-70b --site dgx-h100 --train tp=8,pp=4,dp=8 --infer tp=8,dp=32",
    "--model qwen3-30b-a3b --site dgx-h100 --train tp=2,ep=8 --infer tp=4,dp=4",
    "--model qwen3-30b-a3b --site dgx-h100 --train dp=8 --train-style dtensor --infer tp=4,dp=2 --infer-style sglang",
    "--model qwen2-57b-a14b --site dgx-h100 --train tp=4,ep=4 --infer tp=4,dp=4",
    "--model tiny-llama --site local --train tp=2 --infer tp=2,dp=2",
    "--model tiny-qwen3-moe --site local --train tp=2,ep=2,etp=1 --infer tp=2,dp=2",
    "--model tiny-deepseek --site local --train tp=2,ep=2,etp=1 --infer tp=2,dp=2 --bucket-mb 1",
    "--model tiny-mixtral --site local --train ep=2 --infer tp=2",
    "--model tiny-glm-4.5 --site local --train tp=2,ep=2,etp=1 --infer tp=4",
    "--model tiny-gpt-oss --site local --train dp=2 --train-style dtensor --infer tp=2",
]


def _without_timings(obj, fingerprints: list[str] | None = None, added: frozenset = frozenset()):
    """``obj`` without its ``planning_s`` and the keys in ``added``; with ``fingerprints``: without its
    fingerprints, collected there."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "planning_s" or k in added:
                continue
            if k == "fingerprint" and fingerprints is not None:
                fingerprints.append(v)
                continue
            out[k] = _without_timings(v, fingerprints, added)
        return out
    if isinstance(obj, list):
        return [_without_timings(v, fingerprints, added) for v in obj]
    return obj


def plan_json(args: list[str], tree: str | None, fingerprints: list[str] | None = None,
              added: frozenset = frozenset()) -> str:
    argv = ([sys.executable, "-c", OTHER_TREE, str(Path(tree).absolute())] if tree
            else [str(Path(sys.executable).parent / "reshardctl")])
    argv += ["plan", *args, "--json"] + ([] if "--transport" in args else ["--transport", "all"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.dumps(_without_timings(json.loads(out), fingerprints, added), indent=1, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, metavar="DIR", help="the source tree to compare with")
    ap.add_argument("--fingerprints-changed", action="store_true",
                    help="the fingerprint encoding changed on purpose: require every fingerprint to differ, "
                         "compare the rest")
    ap.add_argument("--added", action="append", default=[], metavar="KEY",
                    help="a key this tree adds to the report on purpose (any depth): left out of this tree's JSON; "
                         "the base must not have it")
    args = ap.parse_args()
    added = frozenset(args.added)
    failed = 0
    for case in CASES:
        words = case.split()
        fb, ft = ([], []) if args.fingerprints_changed else (None, None)
        base, this = plan_json(words, args.base, fb), plan_json(words, None, ft, added)
        same = base == this
        if args.fingerprints_changed:
            # the same plans under the new encoding: as many fingerprints, equal exactly where the base's were
            same = (same and len(fb) == len(ft) and all(a != b for a, b in zip(fb, ft))
                    and all((fb[i] == fb[j]) == (ft[i] == ft[j]) for i in range(len(fb)) for j in range(len(fb))))
        failed += not same
        print(f"{'identical' if same else 'DIFFERS  '}  plan {case or '(defaults)'}")
        if not same:
            print("".join(list(difflib.unified_diff(base.splitlines(True), this.splitlines(True), "base", "this"))[:40]))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
