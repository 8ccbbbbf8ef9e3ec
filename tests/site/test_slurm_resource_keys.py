"""The profile's Slurm resource keys (issue 25): cpus_per_task, mem / mem_per_cpu, gpus_per_task, gpu_bind,
signal, requeue, per-role slurm.resources, container_expand: validated with the key and the arithmetic,
merged per role, round-tripped through the resolved dict, shown by `profile show`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.cli import main
from reshardctl.errors import ProfileError
from reshardctl.site.parse import parse_profile
from reshardctl.site.spec import SIZE_UNITS, profile_to_dict, size_bytes

BASE = {"site": "res", "nodes": 4, "gpus_per_node": 8, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400}}


def _parse(**slurm):
    return parse_profile({**BASE, "slurm": slurm}, "tests/res.yaml")


@pytest.mark.parametrize("slurm,message", [
    ({"mem": "64Q"}, "`slurm.mem`: '64Q' is not a Slurm size"),
    ({"mem_per_cpu": "0"}, "`slurm.mem_per_cpu`: must be more than 0"),
    ({"mem": "2000000T"}, "= 2199023255552000000 bytes is more than the limit of 1125899906842624 bytes"),
    ({"mem": "8G", "mem_per_cpu": "1G"}, "give `slurm.mem` (8G, per node) or `slurm.mem_per_cpu` (1G, per CPU)"),
    ({"gpus_per_task": 2}, "`slurm.gpus_per_task`: must be <= 1"),
    ({"gpu_bind": "single"}, "'single' is not a GPU binding sbatch takes"),
    ({"signal": "TERM@60"}, "SIGNAL one of USR1, USR2"),
    ({"signal": "B:USR1@60"}, "SIGNAL one of USR1, USR2"),
    ({"signal": "USR1@1800", "time_min": 30}, "sent 1800 s before the time limit, but slurm.time_min is 30 min = "
                                              "1800 s: 1800 >= 1800"),
    ({"requeue": "yes"}, "`slurm.requeue`: expected true (--requeue) or false (--no-requeue)"),
    ({"resources": {"train": {"mem": "8G"}}, "mem_per_cpu": "1G"},
     "the trainer tasks ask memory with `mem` but the inference tasks with `mem_per_cpu`"),
    ({"resources": {"trian": {}}}, "`slurm.resources.trian`: unknown key; did you mean `slurm.resources.train`?"),
    ({"resources": {"infer": {"cpus": 2}}}, "`slurm.resources.infer.cpus`: unknown key (known here: cpus_per_task, mem"),
    ({"container_mounts": ["/home/$USER:/h"]}, "write it ${NAME} (e.g. /home/${USER}) and set slurm.container_expand"),
])
def test_bad_resource_values_name_the_key_and_the_arithmetic(slurm, message):
    with pytest.raises(ProfileError) as ei:
        _parse(**slurm)
    assert message in str(ei.value) and "tests/res.yaml" in str(ei.value)


def test_a_roles_resources_override_the_shared_ones_memory_as_a_whole():
    s = _parse(cpus_per_task=4, mem_per_cpu="2g", gpu_bind="closest",
               resources={"infer": {"mem_per_cpu": "1G", "gpu_bind": "none"}, "train": {"cpus_per_task": 8}}).slurm
    assert s.role_resources("train").as_dict() == {"cpus_per_task": 8, "mem_per_cpu": "2G", "gpu_bind": "closest"}
    assert s.role_resources("infer").as_dict() == {"cpus_per_task": 4, "mem_per_cpu": "1G", "gpu_bind": "none"}
    both = _parse(mem=0, resources={"train": {"mem": "512G"}}).slurm
    assert both.role_resources("train").mem == "512G" and both.role_resources("infer").mem == "0"


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 10**6), unit=st.sampled_from(["", "K", "M", "G", "T"]))
def test_slurm_sizes_are_powers_of_1024_and_megabytes_by_default(n, unit):
    assert size_bytes(f"{n}{unit}") == n * SIZE_UNITS[unit or "M"]
    assert size_bytes(f"{n}{unit}B") is None and size_bytes(f"-{n}{unit}") is None


@settings(max_examples=60, deadline=None)
@given(cpus=st.none() | st.integers(1, 64), mem=st.none() | st.from_regex(r"[1-9][0-9]{0,2}[KMGT]?", fullmatch=True),
       bind=st.sampled_from([None, "none", "closest", "single:1", "verbose,per_task:1", "map_gpu:0,1"]),
       sig=st.none() | st.integers(1, 1799).map(lambda s: f"USR2@{s}"), requeue=st.sampled_from([None, True, False]),
       infer_mem=st.none() | st.sampled_from(["4G", "100"]))
def test_resource_keys_round_trip_through_the_resolved_dict(cpus, mem, bind, sig, requeue, infer_mem):
    slurm = {"cpus_per_task": cpus, "mem": mem, "gpu_bind": bind, "signal": sig, "requeue": requeue,
             "gpus_per_task": 1, "time_min": 30}
    if infer_mem:
        slurm["resources"] = {"infer": {"mem": infer_mem, "cpus_per_task": 2}}
    p = _parse(**slurm)
    d = profile_to_dict(p)
    d.pop("source")
    json.dumps(d)
    assert parse_profile(d, "again.yaml") == p and hash(parse_profile(d, "again.yaml")) == hash(p)


def test_profile_show_lists_the_resource_keys(tmp_path, capsys):
    import yaml

    path = tmp_path / "res.yaml"
    path.write_text(yaml.safe_dump({**BASE, "slurm": {"mem": "64G", "signal": "USR1@120", "requeue": False,
                                                      "resources": {"train": {"cpus_per_task": 16}}}}))
    assert main(["profile", "show", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["slurm"]
    assert (s["mem"], s["signal"], s["requeue"], s["resources"]) == ("64G", "USR1@120", False,
                                                                      {"train": {"cpus_per_task": 16}})
    assert main(["profile", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mem = 64G" in out and "signal = USR1@120" in out and "cpus_per_task" in out
