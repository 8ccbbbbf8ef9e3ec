"""Site profiles: shipped profiles, YAML/TOML equivalence, hostlists, every validation error."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import ProfileError
from reshardctl.site import (
    LinkSpec,
    RefitSpec,
    SiteProfile,
    SlurmSpec,
    available_profiles,
    expand_hostlist,
    load_profile,
    parse_profile,
    profile_to_dict,
)

SHIPPED = ["local", "slurm-local", "dgx-h100", "gb200-nvl72"]

FULL_YAML = """\
site: testsite
nodes: gpu[001-004]
gpus_per_node: 8
nvlink_domain_nodes: 2
cpu_only: false
links:
  nvlink_gbytes_per_s: 450
  nic_gbits_per_s: 400
  nics_per_node: 8
  nvlink_latency_us: 2.5
  nic_latency_us: 5
slurm:
  partitions:
    train: big
    infer: small
  account: rl
  qos: high
  time_min: 45
  constraint: "h100&ib"
  gpus_per_node: 8
  container_image: nvcr.io/nvidia/pytorch:24.05-py3
  container_mounts: ["/scratch:/scratch", "/home:/home"]
  modules: [cuda/12.4, nccl]
  env:
    NCCL_IB_HCA: mlx5
    NCCL_IB_TIMEOUT: 22
  extra_sbatch: ["--exclusive", "--mem=0"]
  setup: ["source /etc/profile", "ulimit -n 65536"]
refit:
  transport: hybrid
  latency_budget_s: 12.5
  bucket_mb: 128
  timeout_s: 600
  rendezvous_timeout_s: 90
"""

FULL_TOML = """\
site = "testsite"
nodes = "gpu[001-004]"
gpus_per_node = 8
nvlink_domain_nodes = 2
cpu_only = false

[links]
nvlink_gbytes_per_s = 450
nic_gbits_per_s = 400
nics_per_node = 8
nvlink_latency_us = 2.5
nic_latency_us = 5

[slurm]
account = "rl"
qos = "high"
time_min = 45
constraint = "h100&ib"
gpus_per_node = 8
container_image = "nvcr.io/nvidia/pytorch:24.05-py3"
container_mounts = ["/scratch:/scratch", "/home:/home"]
modules = ["cuda/12.4", "nccl"]
extra_sbatch = ["--exclusive", "--mem=0"]
setup = ["source /etc/profile", "ulimit -n 65536"]

[slurm.partitions]
train = "big"
infer = "small"

[slurm.env]
NCCL_IB_HCA = "mlx5"
NCCL_IB_TIMEOUT = 22

[refit]
transport = "hybrid"
latency_budget_s = 12.5
bucket_mb = 128
timeout_s = 600
rendezvous_timeout_s = 90
"""

MINIMAL = """\
nodes: 4
gpus_per_node: 8
links:
  nvlink_gbytes_per_s: 450
  nic_gbits_per_s: 400
"""


@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


def write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def error_of(path_or_data, source: str = "test.yaml") -> str:
    with pytest.raises(ProfileError) as info:
        if isinstance(path_or_data, Path):
            load_profile(path_or_data)
        else:
            parse_profile(path_or_data, source)
    return str(info.value)


def minimal(**overrides) -> dict:
    data = {"nodes": 4, "gpus_per_node": 8, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400}}
    data.update(overrides)
    return data


# --- shipped profiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name):
    p = load_profile(name)
    assert p.name == name
    assert p.source == f"builtin:{name}"
    assert p.num_nodes % p.nvlink_domain_nodes == 0
    json.dumps(profile_to_dict(p))


def test_shipped_list_matches():
    assert sorted(n for n, _, _ in available_profiles()) == sorted(SHIPPED)


def test_default_is_local():
    p = load_profile(None)
    assert p == load_profile("local")
    assert p.cpu_only and p.num_nodes == 2 and p.gpus_per_node == 4
    assert p.refit.bucket_bytes == 64 * 2**20


def test_vendor_figures():
    dgx = load_profile("dgx-h100")
    assert dgx.nodes[0] == "gpu001" and dgx.nodes[-1] == "gpu128"
    assert (dgx.total_gpus, dgx.gpus_per_domain) == (1024, 8)
    assert dgx.links.nvlink_bytes_per_s == 450e9
    assert dgx.links.nic_bytes_per_s == 50e9
    assert dgx.links.node_nic_bytes_per_s == 400e9
    gb = load_profile("gb200-nvl72")
    assert (gb.num_nodes, gb.gpus_per_domain, gb.num_domains) == (36, 72, 2)
    assert gb.links.nvlink_gbytes_per_s == 900
    sl = load_profile("slurm-local")
    assert sl.nodes == ("n1", "n2", "n3", "n4")
    assert dict(sl.slurm.partitions) == {"train": "debug", "infer": "debug"}
    assert sl.slurm.time_min == 10 and sl.cpu_only


@pytest.mark.parametrize("name", SHIPPED)
def test_resolved_dict_parses_back_to_equal_profile(name):
    p = load_profile(name)
    d = profile_to_dict(p)
    d.pop("source")
    assert parse_profile(json.loads(json.dumps(d)), "roundtrip") == p


# --- YAML / TOML / value objects ------------------------------------------------------------------


def test_yaml_and_toml_give_equal_objects(tmp_path):
    y = load_profile(write(tmp_path, FULL_YAML, "testsite.yaml"))
    t = load_profile(write(tmp_path, FULL_TOML, "testsite.toml"))
    assert y == t and hash(y) == hash(t)
    assert y.source != t.source  # provenance, not content
    assert profile_to_dict(y) | {"source": None} == profile_to_dict(t) | {"source": None}
    assert y.slurm.env["NCCL_IB_TIMEOUT"] == "22"
    assert y.slurm.partitions == {"train": "big", "infer": "small"}
    assert y.refit.transport == "hybrid" and y.gpus_per_domain == 16


def test_yml_suffix_and_pathlike(tmp_path):
    f = write(tmp_path, MINIMAL, "a.yml")
    assert load_profile(f) == load_profile(str(f))


def test_defaults(tmp_path):
    p = load_profile(write(tmp_path, MINIMAL, "mini.yaml"))
    assert p.name == "mini"
    assert p.nodes == ("node001", "node002", "node003", "node004")
    assert p.nvlink_domain_nodes == 1 and not p.cpu_only
    assert p.links == LinkSpec(450.0, 400.0, 1, 2.0, 5.0)
    assert p.slurm.partitions == {} and p.slurm.time_min == 30
    assert p.slurm.gpus_per_node == 8  # GPU site: request the GPUs the ranks use
    assert p.refit == RefitSpec("reshard", 30.0, 256.0, 300.0, 120.0)
    assert p.refit.bucket_bytes == 256 * 2**20


def test_immutable_hashable_picklable():
    p = load_profile("dgx-h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.gpus_per_node = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.slurm.env["X"] = "1"  # type: ignore[index]
    with pytest.raises(TypeError):
        p.slurm.partitions["train"] = "x"  # type: ignore[index]
    assert isinstance(p.nodes, tuple) and isinstance(p.slurm.extra_sbatch, tuple)
    assert pickle.loads(pickle.dumps(p)) == p
    assert len({p, load_profile("dgx-h100")}) == 1


def test_direct_construction_validates():
    links = LinkSpec(450, 400, 8, 2, 5)
    with pytest.raises(ProfileError, match=r"nodes \(30\) is not a multiple of nvlink_domain_nodes \(18\)"):
        SiteProfile("x", "hand", tuple(f"n{i}" for i in range(30)), 4, 18, links)
    with pytest.raises(ProfileError, match="bandwidth|must be > 0"):
        LinkSpec(0, 400)
    with pytest.raises(ProfileError, match="transport"):
        RefitSpec(transport="carrier-pigeon")
    s = SlurmSpec(partitions={"train": "a"}, env={"A": "1"}, modules=["m"])
    assert s.modules == ("m",) and hash(s) == hash(SlurmSpec(partitions={"train": "a"}, env={"A": "1"}, modules=("m",)))


def test_nodes_forms():
    assert parse_profile(minimal(nodes=["a", "b[1-2]"]), "t").nodes == ("a", "b1", "b2")
    assert parse_profile(minimal(nodes="x,y"), "t").nodes == ("x", "y")
    assert parse_profile(minimal(nodes=1000), "t").nodes[-1] == "node1000"


def test_partition_shorthand_and_slurm_gpus():
    p = parse_profile(minimal(slurm={"partition": "debug"}), "t")
    assert p.slurm.partitions == {"train": "debug", "infer": "debug"}
    p = parse_profile(minimal(cpu_only=True), "t")
    assert p.slurm.gpus_per_node is None  # CPU ranks: no GPU request unless asked


def test_profile_path_env_searched_first(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    write(d, MINIMAL.replace("nodes: 4", "nodes: 2"), "local.yaml")
    write(d, MINIMAL, "mysite.toml").write_text(
        'nodes = 4\ngpus_per_node = 8\n[links]\nnvlink_gbytes_per_s = 450\nnic_gbits_per_s = 400\n')
    monkeypatch.setenv("RESHARDCTL_PROFILE_PATH", f"{tmp_path / 'missing'}{os.pathsep}{d}")
    p = load_profile("local")
    assert p.source == str(d / "local.yaml") and not p.cpu_only
    assert load_profile("mysite").name == "mysite"
    names = {n: src for n, src, _ in available_profiles()}
    assert names["local"] == str(d / "local.yaml") and names["dgx-h100"] == "builtin:dgx-h100"


# --- validation errors ----------------------------------------------------------------------------


def test_typo_key_names_file_path_and_suggestion(tmp_path):
    f = write(tmp_path, MINIMAL.replace("nvlink_gbytes_per_s", "nvlink_gbytes_per_sec"))
    msg = error_of(f)
    assert str(f) in msg
    assert "`links.nvlink_gbytes_per_sec`" in msg
    assert "did you mean `links.nvlink_gbytes_per_s`?" in msg


def test_key_in_wrong_section_is_pointed_to_its_section():
    data = minimal()
    data["nic_gbits_per_s"] = 400
    assert "did you mean `links.nic_gbits_per_s`" in error_of(data)


def test_non_numeric_bandwidth(tmp_path):
    f = write(tmp_path, MINIMAL.replace("nic_gbits_per_s: 400", "nic_gbits_per_s: 400Gbps"))
    msg = error_of(f)
    assert str(f) in msg and "`links.nic_gbits_per_s`" in msg
    assert "expected a number of Gbit/s" in msg and "'400Gbps'" in msg


@pytest.mark.parametrize("text", ["4e2", "4.0e2", "4e+2"])
def test_yaml_exponent_string_hint(tmp_path, text):
    """PyYAML reads 4e2, 4.0e2 and 4e+2 as strings (it needs a dot AND a signed exponent): the advice
    names forms that really are numbers, and the advised 4.0e+2 loads as 400."""
    f = write(tmp_path, MINIMAL.replace("nvlink_gbytes_per_s: 450", f"nvlink_gbytes_per_s: {text}"))
    msg = error_of(f)
    assert "4.0e+2" in msg and "400" in msg and "without quotes" not in msg
    f = write(tmp_path, MINIMAL.replace("nvlink_gbytes_per_s: 450", "nvlink_gbytes_per_s: 4.0e+2"))
    assert load_profile(str(f)).links.nvlink_bytes_per_s == 400e9


@pytest.mark.parametrize("nodes,where", [
    (100000000000000000000, "`nodes`: node count 100000000000000000000 is more than the maximum of 1000000"),
    ("n[0-99999999999999999999]", "`nodes`: bad hostlist"),
    ("n[1-999999,1-999999,1-999999]", "`nodes`: bad hostlist"),
    ("a[1-99999][1-99999][1-99999]", "`nodes`: bad hostlist"),
    ("n[1-999999],m[1-999999]", "with the 999999 hosts before it"),
    (["n[1-600000]", "m[1-600000]"], "`nodes[1]`: bad hostlist 'm[1-600000]'"),
])
def test_huge_node_counts_are_refused_before_names_are_built(tmp_path, nodes, where):
    """`nodes: 10**20` used to build 10**20 names (the process was OOM-killed): the count is checked
    against MAX_HOSTS first, for the int form, hostlists and the total of a list; the message names
    the file, the key and the limit."""
    import yaml

    f = write(tmp_path, yaml.safe_dump(minimal(nodes=nodes)))
    msg = error_of(f)
    assert str(f) in msg and where in msg and "1000000" in msg and "MAX_HOSTS" in msg, msg


def test_quoted_number_hint_is_neutral():
    msg = error_of(minimal(links={"nvlink_gbytes_per_s": "450", "nic_gbits_per_s": 400}))
    assert "plain number" in msg and "without quotes" not in msg


@pytest.mark.parametrize("value", [-8, 0])
def test_negative_or_zero_gpu_count(value):
    msg = error_of(minimal(gpus_per_node=value))
    assert "`gpus_per_node`" in msg and f"got {value}" in msg


@pytest.mark.parametrize("key,value", [("gpus_per_node", True), ("nodes", True)])
def test_booleans_are_not_numbers(key, value):
    assert f"`{key}`" in error_of(minimal(**{key: value}))


def test_bool_bandwidth_rejected():
    assert "a boolean" in error_of(minimal(links={"nvlink_gbytes_per_s": True, "nic_gbits_per_s": 400}))


@pytest.mark.parametrize("value", [0, -1.5, float("inf"), float("nan")])
def test_bandwidth_must_be_positive_finite(value):
    assert "`links.nvlink_gbytes_per_s`" in error_of(minimal(links={"nvlink_gbytes_per_s": value, "nic_gbits_per_s": 400}))


def test_domain_arithmetic_message():
    msg = error_of(minimal(nodes=30, gpus_per_node=4, nvlink_domain_nodes=18))
    assert "nodes (30) is not a multiple of nvlink_domain_nodes (18)" in msg
    assert "30 = 1 x 18 + 12" in msg and "18 or 36 nodes" in msg


def test_transport_must_be_known():
    msg = error_of(minimal(refit={"transport": "gather-broadcast"}))
    assert "`refit.transport`" in msg and "did you mean 'gather_broadcast'" in msg


def test_all_problems_reported_together(tmp_path):
    text = """\
nodes: 30
gpus_per_node: -1
nvlink_domain_nodes: 18
links:
  nvlink_gbytes_per_sec: 450
  nic_gbits_per_s: fast
refit:
  transport: pigeon
  bucket_mb: 0
"""
    msg = error_of(write(tmp_path, text))
    for needle in ("`gpus_per_node`", "`links.nvlink_gbytes_per_sec`", "`links.nic_gbits_per_s`",
                   "`refit.transport`", "`refit.bucket_mb`", "nodes (30) is not a multiple"):
        assert needle in msg
    assert "problems:" in msg


def test_missing_required_keys():
    msg = error_of({"site": "x"})
    for key in ("`nodes`", "`gpus_per_node`", "`links`"):
        assert key in msg and "required key is missing" in msg
    assert "`links.nic_gbits_per_s`: required" in error_of(minimal(links={"nvlink_gbytes_per_s": 1}))


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"nodes": "gpu[001-"}, "bad hostlist"),
        ({"nodes": ["a", "a"]}, "more than once"),
        ({"nodes": []}, "empty"),
        ({"nodes": 0}, "node count must be >= 1"),
        ({"nodes": ["a", 3]}, "`nodes[1]`"),
        ({"site": "my site"}, "not a valid site name"),
        ({"links": "fast"}, "`links`: expected a mapping"),
        ({"slurm": {"partition": "a", "partitions": {"train": "b"}}}, "not both"),
        ({"slurm": {"partitions": {"trian": "b"}}}, "did you mean `slurm.partitions.train`"),
        ({"slurm": {"env": {"NCCL_DEBUG": True}}}, "`slurm.env.NCCL_DEBUG`"),
        ({"slurm": {"env": {"1BAD": "x"}}}, "not a valid environment variable name"),
        ({"slurm": {"modules": "cuda"}}, "`slurm.modules`: expected a list"),
        ({"slurm": {"extra_sbatch": ["#SBATCH --exclusive"]}}, "without '#SBATCH'"),
        ({"slurm": {"extra_sbatch": ["exclusive"]}}, "`slurm.extra_sbatch[0]`"),
        ({"slurm": {"gpus_per_node": 4}}, "every rank needs its GPU"),
        ({"slurm": {"time_min": 0}}, "`slurm.time_min`"),
        ({"slurm": {"time_min": 1.5}}, "whole number"),
        ({"cpu_only": "yes"}, "`cpu_only`: expected true or false"),
        ({"links": {"nvlink_gbytes_per_s": 1, "nic_gbits_per_s": 1, "nics_per_node": 0}}, "`links.nics_per_node`"),
        ({"refit": {"timeout_s": -1}}, "`refit.timeout_s`"),
        ({"refit": {"rendezvous_timeout_s": "2m"}}, "`refit.rendezvous_timeout_s`"),
    ],
)
def test_invalid_values(overrides, needle):
    assert needle in error_of(minimal(**overrides))


def test_unreadable_missing(tmp_path):
    msg = error_of(tmp_path / "nope.yaml")
    assert str(tmp_path / "nope.yaml") in msg and "no such file" in msg


def test_unreadable_directory(tmp_path):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    assert "is a directory" in error_of(d)


def test_unreadable_permission_simulated(tmp_path, monkeypatch):
    f = write(tmp_path, MINIMAL)

    def deny(path, flags, *a):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("reshardctl.bounded_load.os.open", deny)
    msg = error_of(f)
    assert str(f) in msg and "permission denied" in msg


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_permission_real(tmp_path):
    f = write(tmp_path, MINIMAL)
    f.chmod(0)
    try:
        assert "permission denied" in error_of(f)
    finally:
        f.chmod(0o600)


def test_unknown_suffix(tmp_path):
    assert "unknown file type '.json'" in error_of(write(tmp_path, "{}", "x.json"))


def test_unknown_name_suggests():
    with pytest.raises(ProfileError) as info:
        load_profile("dgx-h200")
    assert "no site profile named 'dgx-h200'" in str(info.value) and "dgx-h100" in str(info.value)


def test_yaml_syntax_error_has_line(tmp_path):
    f = write(tmp_path, "nodes: 4\ngpus_per_node: 8\nlinks: {nvlink_gbytes_per_s: 1\n")
    msg = error_of(f)
    assert str(f) in msg and "YAML syntax error at line" in msg


def test_yaml_duplicate_key(tmp_path):
    msg = error_of(write(tmp_path, MINIMAL + "gpus_per_node: 4\n"))
    assert "duplicate key 'gpus_per_node'" in msg and "line 6" in msg


def test_toml_syntax_error_has_line(tmp_path):
    f = write(tmp_path, 'nodes = 4\ngpus_per_node = \n', "bad.toml")
    msg = error_of(f)
    assert str(f) in msg and "TOML syntax error" in msg and "line 2" in msg


@pytest.mark.parametrize("text,needle", [("", "empty"), ("- a\n- b\n", "mapping of keys at the top level")])
def test_empty_or_non_mapping_file(tmp_path, text, needle):
    assert needle in error_of(write(tmp_path, text))


def test_not_utf8(tmp_path):
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in error_of(f)


# --- hostlists ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr,expected",
    [
        ("gpu[001-003]", ("gpu001", "gpu002", "gpu003")),
        ("n[1-4]", ("n1", "n2", "n3", "n4")),
        ("a[1,3-5]b", ("a1b", "a3b", "a4b", "a5b")),
        ("x,y", ("x", "y")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("r[1-2]n[1,3]", ("r1n1", "r1n3", "r2n1", "r2n3")),
        ("a[1-2],b,c[7]", ("a1", "a2", "b", "c7")),
        ("gpu[001-002,010],login01", ("gpu001", "gpu002", "gpu010", "login01")),
        (" host ", ("host",)),
        ("node-[1-2].cluster", ("node-1.cluster", "node-2.cluster")),
    ],
)
def test_expand_hostlist(expr, expected):
    assert expand_hostlist(expr) == expected


@pytest.mark.parametrize(
    "expr,needle",
    [
        ("", "empty"),
        ("a[", "never closed"),
        ("a]", "without '['"),
        ("a[[1]]", "nested"),
        ("a[]", "empty brackets"),
        ("a[1-]", "incomplete"),
        ("a[-3]", "incomplete"),
        ("a[3-1]", "backwards"),
        ("a[x]", "not made of digits"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        ("a b", "whitespace"),
        ("n[0-99999999]", "more than"),
    ],
)
def test_expand_hostlist_errors(expr, needle):
    with pytest.raises(ProfileError, match="bad hostlist") as info:
        expand_hostlist(expr)
    assert needle in str(info.value)


_prefix = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=6)
_suffix = st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-", max_size=4)
_range = st.tuples(st.integers(0, 2000), st.integers(0, 30), st.integers(1, 5))  # lo, count-1, width


@st.composite
def _item(draw):
    prefix, suffix = draw(_prefix), draw(_suffix)
    ranges = draw(st.lists(_range, min_size=1, max_size=4))
    parts, numbers = [], []
    for lo, extra, width in ranges:
        hi = lo + extra
        lo_s = f"{lo:0{width}d}"
        parts.append(lo_s if extra == 0 else f"{lo_s}-{hi}")
        numbers += [f"{n:0{len(lo_s)}d}" for n in range(lo, hi + 1)]
    return f"{prefix}[{','.join(parts)}]{suffix}", [f"{prefix}{n}{suffix}" for n in numbers]


@settings(max_examples=200, deadline=None)
@given(st.lists(_item(), min_size=1, max_size=4))
def test_hostlist_property(items):
    expr = ",".join(e for e, _ in items)
    expected = tuple(h for _, hosts in items for h in hosts)
    got = expand_hostlist(expr)
    assert got == expected
    # every name keeps the zero padding of its range's low bound and round-trips alone
    for host in got[:5]:
        assert expand_hostlist(host) == (host,)


def test_docs_examples_yaml_and_toml_agree(tmp_path):
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "site-profiles.md").read_text()
    # the profile examples are fenced at the start of a line (the indented toml block is the user config file)
    yaml_text = re.search(r"^```yaml\n(.*?)^```", doc, re.S | re.M).group(1)
    toml_text = re.search(r"^```toml\n(.*?)^```", doc, re.S | re.M).group(1)
    y = load_profile(write(tmp_path, yaml_text, "ex.yaml"))
    t = load_profile(write(tmp_path, toml_text, "ex.toml"))
    assert y == t and y.name == "mycluster" and y.total_gpus == 128
