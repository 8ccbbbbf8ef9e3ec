"""RefitRequest: the JSON round trip, and strict refusal of anything else (file and key named, exit 2)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import InputError
from reshardctl.request.request import FORMAT, PLAN_KINDS, RUN_KINDS, RefitRequest, RunSettings

text = st.text(max_size=12)
opt_text = st.none() | text
number = st.floats(allow_nan=False, allow_infinity=False, width=64)
words = st.lists(text, max_size=3).map(tuple)

run_settings = st.builds(
    RunSettings, transports=words, iterations=st.integers(), warmup=st.integers(), baseline=st.booleans(),
    timeout_s=st.none() | number, retries=st.integers(), on_failure=text, launcher=opt_text, slurm_mode=opt_text,
    checkpoint=opt_text, full_check=st.booleans(), inject=words)
requests = st.builds(
    RefitRequest, site=text, model=text, layers=st.none() | st.integers(), mtp=st.booleans(), train=opt_text,
    infer=opt_text, train_style=text, infer_style=text, train_layout=opt_text, infer_layout=opt_text,
    transport=text, bucket_mb=st.none() | number, relay=text, run=st.none() | run_settings)

# a value of the wrong JSON type for each kind of field
WRONG = {"str": [1, None, True, ["a"]], "str?": [1, True, {}], "int": ["1", 1.5, True, None], "int?": ["1", 1.5, False],
         "bool": [0, "true", None], "number?": ["1", True, float("nan"), float("inf")], "strs": ["a", [1], None],
         "number": ["1", None]}


@settings(max_examples=200, deadline=None)
@given(requests)
def test_the_json_round_trip_is_the_identity(req):
    obj = json.loads(json.dumps(req.to_json()))  # through JSON text, as summary.json holds it
    assert obj["format"] == FORMAT
    assert RefitRequest.from_json(obj, where="summary.json") == req


def _mutations(obj: dict):
    """(key path, mutated object): every field with a wrong type, missing, and an unknown key added."""
    for key, kind in PLAN_KINDS.items():
        for bad in WRONG[kind]:
            yield f"request.{key}", {**obj, key: bad}
        yield f"request.{key}", {k: v for k, v in obj.items() if k != key}
    yield "request.", {**obj, "bogus": 1}
    yield "request.run", {k: v for k, v in obj.items() if k != "run"}
    yield "request.run", {**obj, "run": [1]}
    if obj["run"] is not None:
        for key, kind in RUN_KINDS.items():
            for bad in WRONG[kind]:
                yield f"request.run.{key}", {**obj, "run": {**obj["run"], key: bad}}
            yield f"request.run.{key}", {**obj, "run": {k: v for k, v in obj["run"].items() if k != key}}
        yield "request.run.", {**obj, "run": {**obj["run"], "extra": True}}


@settings(max_examples=40, deadline=None)
@given(requests, st.data())
def test_a_mutated_request_is_refused_naming_the_file_and_key(req, data):
    muts = list(_mutations(req.to_json()))
    key, obj = data.draw(st.sampled_from(muts))
    with pytest.raises(InputError) as e:
        RefitRequest.from_json(obj, where="run x: summary.json")
    msg = str(e.value)
    assert msg.startswith("run x: summary.json: ") and f"`{key}" in msg, (key, msg)


@pytest.mark.parametrize("fmt, says", [
    ("reshardctl-request/2", "written by a newer reshardctl"),
    ("reshardctl-request/17", "written by a newer reshardctl"),
    ("reshardctl-session/1", "`request.format` must be 'reshardctl-request/1'"),
    (None, "`request.format` must be"),
    (1, "`request.format` must be"),
])
def test_another_or_a_newer_format_is_refused(fmt, says):
    obj = {**RefitRequest().to_json(), "format": fmt}
    with pytest.raises(InputError) as e:
        RefitRequest.from_json(obj, where="session.json")
    assert str(e.value).startswith("session.json: ") and says in str(e.value)


def test_not_an_object_is_refused():
    for obj in ([], "x", None, 3):
        with pytest.raises(InputError, match=r"summary.json: `request` must be a JSON object"):
            RefitRequest.from_json(obj, where="summary.json")


def test_the_defaults_are_the_command_lines():
    """`reshardctl plan` without options plans RefitRequest(): the option defaults are the request's."""
    from reshardctl.commands.options import REQUEST_OPTIONS
    from reshardctl.site.default_site import choose_site

    for name, (_, option) in REQUEST_OPTIONS.items():
        if name == "site":  # not given: RESHARDCTL_SITE, the user's config, then the request's default
            assert option.default is None and choose_site(None).site == RefitRequest().site
            continue
        assert option.default == getattr(RefitRequest(), name), name


def test_every_field_has_a_json_kind():
    """A field added to the dataclasses without a kind would be left out of to_json / from_json."""
    from dataclasses import fields

    assert set(PLAN_KINDS) | {"run"} == {f.name for f in fields(RefitRequest)}
    assert set(RUN_KINDS) == {f.name for f in fields(RunSettings)}
