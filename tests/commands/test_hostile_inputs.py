"""Every case of issue 14 ("Tracebacks and hangs", "Accepted but wrong", "Outputs" of `plan`): exit code 2,
a message naming the file, the key and the limit, nothing written. Hangs are tested by behaviour: the
bounded loaders refuse before anything is built (a constructor that must not run is replaced by one
that fails the test), never by wall-clock limits."""

from __future__ import annotations

import json
import os
import struct

import pytest
import yaml

from reshardctl import bounded_load
from reshardctl.cli import main

BASE = """site: t
nodes: 2
gpus_per_node: 4
cpu_only: true
links: {nvlink_gbytes_per_s: 10, nic_gbits_per_s: 10}
"""
SMALL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def alias_bomb(levels: int = 9, fanout: int = 9) -> str:
    text = "a0: &a0 [" + ", ".join(['"x"'] * fanout) + "]\n"
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]\n"
    return text + f"site: *a{levels - 1}\n"


# ------------------------------------------------------------------------------------- profiles ----
PROFILE_CASES = [
    ("listkey.yaml", BASE + "? [a, b]\n: 1\n", "a key at line 6, column 3 is a list; keys must be plain names"),
    ("envkey.yaml", BASE + "slurm: {env: {[a]: x}}\n", "a key at line 6, column 15 is a list"),
    ("deep.yaml", BASE + "refit: " + "[" * 2000 + "]" * 2000 + "\n", "nested more than 64 lists/mappings deep"),
    ("deep.toml", "x = " + "[" * 2000 + "]" * 2000 + "\n", "nested more than 64 lists/mappings deep (line 1"),
    ("bigint.yaml", BASE.replace("gpus_per_node: 4", "gpus_per_node: " + "9" * 5000),
     "a number of 5,000 characters at line 3, column 16 (the limit is 64, MAX_NUMBER_CHARS)"),
    ("bigint.toml", 'nodes = 2\ngpus_per_node = ' + "9" * 5000 + "\n", "a number of 5,000 characters (line 2"),
    ("gpus.yaml", BASE.replace("gpus_per_node: 4", "gpus_per_node: 100000000000000000000"),
     "`gpus_per_node`: must be <= 1024 (the limit for this key), got 100000000000000000000"),
    ("gpus.toml", 'nodes = 2\ngpus_per_node = 99999999999999999999999\ncpu_only = true\n[links]\n'
     'nvlink_gbytes_per_s = 10\nnic_gbits_per_s = 10\n', "`gpus_per_node`: must be <= 1024"),
    ("b300.yaml", BASE + "refit: {bucket_mb: 1.0e+300}\n",
     "`refit.bucket_mb`: 1e+300 MiB is more than the limit of 1048576 MiB (1 TiB)"),
    ("bsmall.yaml", BASE + "refit: {bucket_mb: 1.0e-30}\n",
     "`refit.bucket_mb`: 1e-30 MiB x 1048576 bytes/MiB = 1.05e-24 bytes, less than one byte"),
    ("bomb.yaml", alias_bomb(), "more than 100,000 values at line"),
    ("recursive.yaml", BASE + "x: &a [*a]\n", "alias *a at line 6, column 8 refers to a value that contains it"),
    ("bigsite.yaml", BASE.replace("site: t", "site: " + "x" * 150_000), "is not a valid site name"),
    ("timeout.yaml", BASE + "refit: {timeout_s: 1.0e+300}\n", "`refit.timeout_s`: must be <= 604800"),
]


@pytest.mark.parametrize("name,text,needle", PROFILE_CASES, ids=[c[0] for c in PROFILE_CASES])
def test_hostile_profile_refused(capsys, tmp_path, name, text, needle):
    f = tmp_path / name
    f.write_text(text)
    for argv in (["profile", "validate", str(f)], ["plan", "--site", str(f)]):
        code, _out, err = run(capsys, *argv)
        assert code == 2 and needle in err and str(f) in err, err
        assert max(len(line) for line in err.splitlines()) < 400  # a 150 KB value is never printed whole


def test_profile_values_not_built_past_the_bounds(tmp_path, monkeypatch):
    """Bounded YAML refuses while composing (the node graph): constructing Python values never starts."""
    def boom(self, node):
        raise AssertionError("the document was constructed although a bound was exceeded")
    monkeypatch.setattr(bounded_load._BoundedLoader, "construct_document", boom)
    for text in (alias_bomb(), "x: " + "[" * 2000 + "]" * 2000, "x: " + "9" * 5000, "? [a, b]\n: 1\n",
                 "x: &a [*a]\n", "x: {[a]: 1}\n"):
        with pytest.raises(bounded_load.LoadError):
            bounded_load.loads_yaml(text)


def test_plan_refuses_the_profile_validate_refuses(capsys, tmp_path):
    """validate and plan agree: one check (site.spec.bucket_mb_problem) for the file and the flag."""
    for value in ("1.0e-30", "1.0e+300", "0.5"):
        f = tmp_path / "b.yaml"
        f.write_text(BASE + f"refit: {{bucket_mb: {value}}}\n")
        vc, _, _ = run(capsys, "profile", "validate", str(f))
        pc, _, _ = run(capsys, "plan", "--site", str(f))
        assert vc == pc == (0 if value == "0.5" else 2)
    for flag in ("1e13", "1e300", "1e-30"):
        code, _, err = run(capsys, "plan", "--bucket-mb", flag)
        assert code == 2 and f"--bucket-mb {float(flag):g}:" in err


@pytest.mark.parametrize("kind", ["fifo", "devzero", "dir"])
def test_special_profile_files(capsys, tmp_path, kind):
    f = tmp_path / "p.yaml"
    if kind == "fifo":
        os.mkfifo(f)  # would block a plain open() forever
    elif kind == "devzero":
        f.symlink_to("/dev/zero")  # would fill memory
    else:
        f.mkdir()
    code, _, err = run(capsys, "profile", "validate", str(f))
    what = {"fifo": "is a FIFO (named pipe), not a file", "devzero": "is a character device, not a file",
            "dir": "is a directory"}[kind]
    assert code == 2 and f"cannot read site profile {f}: {what}" in err


def test_local_profile_does_not_call_loopback_nvlink(capsys):
    code, out, _ = run(capsys, "profile", "show", "local")
    assert code == 0 and "NVLink (per GPU)" not in out and "intra-node loopback (per rank)" in out
    code, out, _ = run(capsys, "profile", "show", "dgx-h100")
    assert code == 0 and "NVLink (per GPU)" in out


# ----------------------------------------------------------------------------------- model configs ----
def _config(tmp_path, name, text):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(text)
    return str(d)


def _cfg(**kw):
    c = dict(SMALL)
    c.update(kw)
    return json.dumps(c)


MODEL_CASES = [
    ("mt", json.dumps({k: v for k, v in {**SMALL, "model_type": ["llama"]}.items() if k != "architectures"}),
     "key 'model_type' must be a string such as 'llama', got a list"),
    ("mt-arch", _cfg(model_type=["llama"]),  # beside a valid 'architectures' too (it used to be ignored)
     "key 'model_type' must be a string such as 'llama', got a list"),
    ("fmt", _cfg(quantization_config={"quant_method": "fp8", "fmt": [], "weight_block_size": [128, 128]}),
     "key 'quantization_config.fmt' must be e4m3 or e5m2, got a list"),
    ("digits", _cfg()[:-1] + ', "x": ' + "9" * 5000 + "}", "a number of 5,000 characters"),
    ("deep", _cfg()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 64"),
    ("vocab", _cfg(vocab_size=10**19), "key 'vocab_size' must be <= 16777216 (MAX_DIM"),
    ("vocabf", _cfg()[:-1] + ', "vocab_size": 1e19}', "key 'vocab_size' must be an integer, got 1e+19"),
    ("hidden", _cfg(hidden_size=10**15), "key 'hidden_size' must be <= 16777216 (MAX_DIM"),
    ("layers", _cfg(num_hidden_layers=100_000_000), "key 'num_hidden_layers' must be <= 4096 (MAX_LAYERS"),
]


@pytest.mark.parametrize("name,text,needle", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_hostile_config_refused(capsys, tmp_path, name, text, needle):
    path = _config(tmp_path, name, text)
    for argv in (["model", "show", path, "--layers", "2"], ["plan", "--model", path]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and needle in err and "config.json" in err, err


def test_expert_and_layer_counts_are_refused_before_any_tensor_is_built(capsys, tmp_path, monkeypatch):
    from reshardctl.models import config as config_mod

    def boom(*a, **k):
        raise AssertionError("a tensor was built")
    monkeypatch.setattr(config_mod._Builder, "row", boom)
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
           "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4000, "vocab_size": 256,
           "num_experts": 60000, "num_experts_per_tok": 2}
    path = _config(tmp_path, "moe", json.dumps(moe))
    code, _, err = run(capsys, "model", "show", path, "--layers", "2")
    assert code == 2 and "4000 layers (num_hidden_layers) with 60000 experts expand to" in err
    assert "more than the limit of 2,000,000 (MAX_TENSORS)" in err
    code, _, err = run(capsys, "model", "show", _config(tmp_path, "e", json.dumps({**moe, "num_experts": 10**7})))
    assert code == 2 and "key 'num_experts' must be <= 65536 (MAX_EXPERTS" in err


def test_config_special_files(capsys, tmp_path):
    d = tmp_path / "z"
    d.mkdir()
    (d / "config.json").symlink_to("/dev/zero")
    code, _, err = run(capsys, "model", "show", str(d / "config.json"))
    assert code == 2 and "config.json: cannot read: is a character device, not a file" in err
    os.mkfifo(tmp_path / "f.json")
    code, _, err = run(capsys, "model", "show", str(tmp_path / "f.json"))
    assert code == 2 and "is a FIFO (named pipe), not a file" in err


def test_safetensors_header_shape_1e999(capsys, tmp_path):
    d = tmp_path / "st"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL))
    header = b'{"model.norm.weight": {"dtype": "BF16", "shape": [1e999], "data_offsets": [0, 2]}}'
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    code, _, err = run(capsys, "model", "show", str(d / "model.safetensors"))
    assert code == 2 and "bad header entry for 'model.norm.weight': shape [inf]: each dim must be an integer" in err


def test_model_show_tensors_and_the_tensor_hint(capsys):
    code, out, _ = run(capsys, "model", "show", "tiny-llama", "--tensors", "--filter", "*layers.1.*_proj*", "--json")
    names = [r["name"] for r in json.loads(out)]
    assert code == 0 and names and all(".layers.1." in n and "_proj" in n for n in names)
    code, _, err = run(capsys, "layout", "show", "--tensor", "nope*")
    assert code == 2 and "reshardctl model show tiny-llama --tensors --filter GLOB" in err
    code, _, err = run(capsys, "model", "show", "tiny-llama", "--filter", "x")
    assert code == 2 and "--filter selects tensor names: give it with --tensors" in err


# ------------------------------------------------------------------------------------ layout files ----
@pytest.fixture
def infer_doc(tmp_path, capsys):
    f = tmp_path / "inf.yaml"
    assert main(["layout", "export", "--side", "infer", "-o", str(f)]) == 0
    capsys.readouterr()
    return yaml.safe_load(f.read_text())


def _norm_with(doc, slots):
    t = doc["tensors"]["model.norm.weight"]
    shape = doc["templates"][t["template"]]["shape"]
    doc["templates"].append({"shape": shape, "slots": slots})
    t["template"] = len(doc["templates"]) - 1
    return doc


LAYOUT_CASES = [
    ("templates5", lambda d: {**d, "templates": 5}, "templates: expected a list of {shape, slots}, got 5"),
    ("meshes12", lambda d: {**d, "meshes": [1, 2]}, "meshes: expected a mapping name -> {shape, dim_names, ranks}, got [1, 2]"),
    ("meshes5", lambda d: {**d, "meshes": 5}, "meshes: expected a mapping"),
    ("bigmesh", lambda d: {"world_size": 4, "default": {"mesh": {"shape": [100000, 100000]}, "placements": ["R", "R"]}},
     "default.mesh.shape: 100000 x 100000 = 10,000,000,000 ranks, more than the limit of 1,048,576 (MAX_WORLD)"),
    ("stages", lambda d: {**d, "stages": [[0, 99]]}, "stages[0]: ranks [99] are outside world_size 4 (ranks 0..3)"),
    ("halfbox", lambda d: _norm_with(d, [[[[0, 512.5]]], [[[0, 1024]]], [[[0, 1024]]], [[[0, 1024]]]]),
     "box [[0, 512.5]] must be one [lo, hi] pair of integers per dim (shape [1024])"),
    ("holes", lambda d: _norm_with(d, [[[[0, 10]]], [[[20, 30]]], [], []]),
     "the slots hold 20 of the 1,024 elements of shape [1024]: every element must be held by some rank"),
]


@pytest.mark.parametrize("name,mutate,needle", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
@pytest.mark.parametrize("side", ["train", "infer"])
def test_hostile_layout_file_refused_on_both_sides(capsys, tmp_path, infer_doc, name, mutate, needle, side):
    doc = mutate(infer_doc)
    doc.pop("side", None)
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(doc))
    code, _, err = run(capsys, "plan", f"--{side}-layout", str(f))
    assert code == 2 and needle in err and str(f) in err, err
    assert err.count("\n  - ") <= 1  # one problem, not one follow-up per tensor that uses the template


def test_layout_file_directory_and_special_files(capsys, tmp_path):
    code, _, err = run(capsys, "plan", "--train-layout", str(tmp_path))
    assert code == 2 and f"--train-layout {tmp_path}: is a directory; give a layout file" in err
    (tmp_path / "z.yaml").symlink_to("/dev/zero")
    code, _, err = run(capsys, "layout", "show", "--infer-layout", str(tmp_path / "z.yaml"))
    assert code == 2 and "cannot read layout file: is a character device, not a file" in err


# -------------------------------------------------------------------------- parallel strings ----
@pytest.mark.parametrize("flag", ["--train", "--infer"])
def test_empty_parallel_string_is_refused_not_tp1(capsys, flag):
    code, _, err = run(capsys, "plan", flag, "")
    assert code == 2 and f"{flag} '': empty; leave {flag} out for the default" in err
    code, out, _ = run(capsys, "plan", "--json")  # leaving it out is the documented default
    assert code == 0 and "tp=2" in json.loads(out)["inputs"][flag[2:]]


def test_vpp_needs_pp(capsys):
    code, _, err = run(capsys, "plan", "--train", "tp=2,vpp=2")
    assert code == 2 and "--train: vpp=2 needs pp > 1" in err


# ------------------------------------------------------------------------------------- plan outputs ----
def test_out_and_export_the_same_path_leave_nothing(capsys, tmp_path):
    same = tmp_path / "same"
    code, _, err = run(capsys, "plan", "--out", str(same), "--export-transfers", str(same))
    assert code == 2 and f"--out and --export-transfers both name {same}" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--out", "--export-transfers"])
def test_empty_output_names(capsys, tmp_path, flag, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "plan", flag, "")
    assert code == 2 and f"{flag} '': empty" in err and list(tmp_path.iterdir()) == []


def test_export_to_stdout(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "plan", "--transport", "reshard", "--export-transfers", "-")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines and all(line["op"] == "p2p" for line in lines)
    assert "transfer lines to stdout" in err and "fingerprint" in err  # the table went to stderr
    assert list(tmp_path.iterdir()) == []  # no file named '-'
    code, out, _ = run(capsys, "plan", "--json", "--export-transfers", "-")
    assert code == 2 and json.loads(out)["error"]["type"] == "OutputError"


def test_out_and_export_create_parents_alike(capsys, tmp_path):
    out, exp = tmp_path / "a" / "b" / "c", tmp_path / "no" / "dir" / "t.jsonl"
    code, _, _ = run(capsys, "plan", "--transport", "reshard", "--out", str(out), "--export-transfers", str(exp))
    assert code == 0 and (out / "plan.json").is_file() and exp.read_text()


def test_failed_plan_removes_the_parents_it_created(capsys, tmp_path):
    code, _, _ = run(capsys, "plan", "--out", str(tmp_path / "x" / "y"), "--export-transfers", "/proc/t.jsonl")
    assert code == 2 and list(tmp_path.iterdir()) == []


def test_symlinks_are_written_through(capsys, tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    code, _, _ = run(capsys, "plan", "--transport", "reshard", "--export-transfers", str(link))
    assert code == 0 and link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text().splitlines()[0])["op"] == "p2p"


def test_export_onto_a_fifo_is_refused(capsys, tmp_path):
    os.mkfifo(tmp_path / "p")
    code, _, err = run(capsys, "plan", "--export-transfers", str(tmp_path / "p"))
    assert code == 2 and "exists and is not a regular file" in err


# ------------------------------------------------------------------------------------- the CLI ----
@pytest.mark.parametrize("argv", [
    ["plan", "--json", "--train", "tp=3"], ["profile", "show", "nope", "--json"], ["model", "show", "nope", "--json"],
    ["layout", "show", "--json", "--side", "x"], ["model", "list", "--json", "--bogus"],
    ["profile", "list", "--json", "--bogus"], ["run", "--json", "--train", "tp=3"], ["bench", "--json", "--layers", "0"],
])
def test_json_errors_are_json(capsys, argv):
    code, out, err = run(capsys, *argv)
    e = json.loads(out)["error"]
    assert code == 2 and e["exit_code"] == 2 and e["type"] and e["message"] and err == ""


def test_verbose_and_quiet_after_the_command(capsys):
    assert run(capsys, "plan", "--verbose", "--transport", "reshard")[0] == 0
    code, _, err = run(capsys, "plan", "-q", "--out", "/proc/x")
    assert code == 2 and err.count("error:") == 1  # one message, not two


def test_layers_0_is_the_same_error_everywhere(capsys):
    errs = {run(capsys, *argv)[2] for argv in (["plan", "--layers", "0"], ["layout", "show", "--layers", "0"],
                                                 ["model", "show", "tiny-llama", "--layers", "0"])}
    assert errs == {"error: model tiny-llama: --layers must be between 1 and 4, got 0\n"}


@pytest.mark.parametrize("argv", [[], ["plan"], ["run"], ["bench"], ["layout", "show"], ["layout", "export"],
                                  ["model", "show"], ["model", "list"], ["profile", "show"], ["profile", "validate"],
                                  ["profile", "list"], ["jobs"], ["cancel"], ["collect"]])
def test_help_has_no_python_types_and_no_flag_placeholders(capsys, argv):
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    for bad in ("<bool>", "<str>", "<int", "<float>", "<list", "range>", "[x>="):
        assert bad not in out, (argv, bad)


def test_quickstart_error_example_is_the_real_output(capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "quickstart.md").read_text()
    block = re.search(r"```\n\$ reshardctl (plan [^\n]*)\n(.*?)```", doc, re.S)
    code, out, err = run(capsys, *block.group(1).split())
    assert code == 2 and out == "" and err == block.group(2)
