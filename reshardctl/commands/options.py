"""The options of a refit request, declared once, and the options several commands share.

``@refit_options(...)`` replaces a command's ``request`` parameter by the request's options (the typer
command reads the function's ``__signature__``) and hands the command one ``RefitRequest`` built from
them (``--transport`` and the run settings differ per command: each command sets them with
``request.replace``). ``@refit_options(..., given=True)`` hands a mapping of the options given instead
(``promote``/``rollback``: a flag left out is the run's own).

Every command whose request options include ``--model`` and ``--train`` (``plan``, ``run``, ``bench``,
``layout show``, ``layout export``) also takes ``--from FILE``: the RL framework's own config (NeMo RL YAML,
verl YAML or launch script), from which ``request/from_config.apply_from`` derives the model, both
parallel strings and styles; the derived flags and where each value came from are printed on stderr
(docs/deployments.md says which flags may be given beside it).

Placeholders name what to give (``SPEC``, ``FILE``, ``N``); ``cli._placeholders`` fills in the rest and
blanks them for flags. ``--layers`` has no typer range: ``0`` is refused by the model catalog with the
same message in every command.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from reshardctl.commands import output
from reshardctl.request.request import RefitRequest
from reshardctl.site.default_site import choose_site

SITE = typer.Option(None, "--site", metavar="NAME|FILE",
                    help="Site profile name or file (default: $RESHARDCTL_SITE, else site in "
                         "~/.config/reshardctl/config.toml, else local).")
MODEL = typer.Option("tiny-llama", "--model", "-m", metavar="MODEL",
                     help="Preset name or path (config.json / index / directory).")
LAYERS = typer.Option(None, "--layers", metavar="N", help="Keep only the first N decoder layers (N >= 1).")
TRAIN = typer.Option(None, "--train", metavar="SPEC",
                     help='Trainer parallelism, e.g. "tp=4,pp=2"; leave it out for the default tp=2,dp=2.')
INFER = typer.Option(None, "--infer", metavar="SPEC",
                     help='Inference parallelism, e.g. "tp=8,dp=2"; leave it out for the default tp=2,dp=2.')
TRAIN_STYLE = typer.Option("megatron", "--train-style", metavar="STYLE", help="megatron | dtensor")
INFER_STYLE = typer.Option("vllm", "--infer-style", metavar="STYLE", help="vllm | sglang | dtensor")
MTP = typer.Option(False, "--mtp", help="Include the model's MTP layers (DeepSeek num_nextn_predict_layers) in both "
                   "layouts: Megatron mtp.layers.{k}, the vLLM MTP draft (not with --layers).")
TRAIN_LAYOUT = typer.Option(None, "--train-layout", metavar="FILE", help="Trainer layout file (overrides --train).")
INFER_LAYOUT = typer.Option(None, "--infer-layout", metavar="FILE", help="Inference layout file (overrides --infer).")
BUCKET_MB = typer.Option(None, "--bucket-mb", metavar="MIB",
                         help="Bucket / round bound in MiB, up to 1048576 (default: the profile's refit.bucket_mb).")
RELAY = typer.Option("auto", "--relay", metavar="MODE", help="Two-stage NVLink fan-out: auto | on | off.")
FROM = typer.Option(None, "--from", metavar="FILE",
                    help="The RL framework's own config (NeMo RL YAML, verl YAML or launch script): derive the model, "
                         "--train/--infer and styles from it (docs/deployments.md).")
JSON = typer.Option(False, "--json", help="Print only the JSON report on stdout (errors too, as JSON).")
REQUEST: Any = None  # the default of a `request` parameter after defaulted ones (refit_options replaces it)

# the request's options: field -> (type, option), in the order --help lists them
REQUEST_OPTIONS: dict[str, tuple[Any, Any]] = {
    "site": (Optional[str], SITE), "model": (str, MODEL), "layers": (Optional[int], LAYERS), "train": (Optional[str], TRAIN),
    "infer": (Optional[str], INFER), "train_style": (str, TRAIN_STYLE), "infer_style": (str, INFER_STYLE),
    "train_layout": (Optional[str], TRAIN_LAYOUT), "infer_layout": (Optional[str], INFER_LAYOUT),
    "mtp": (bool, MTP), "bucket_mb": (Optional[float], BUCKET_MB), "relay": (str, RELAY),
}
LAYOUT_FIELDS = ("model", "layers", "train", "infer", "train_style", "infer_style", "train_layout", "infer_layout",
                 "mtp")
PLAN_FIELDS = ("site", *LAYOUT_FIELDS, "bucket_mb", "relay")

# promote / rollback: what is promoted or validated; None = not given (the run's own, or the last promotion's)
RUNBOOK_OPTIONS: dict[str, tuple[Any, Any]] = {
    "model": (Optional[str], typer.Option(None, "--model", "-m", help="Model (preset or path).")),
    "layers": (Optional[int], LAYERS),
    "train": (Optional[str], typer.Option(None, "--train", help='Trainer parallelism, e.g. "tp=2,pp=2".')),
    "infer": (Optional[str], typer.Option(None, "--infer", help='Inference parallelism, e.g. "tp=2,dp=2".')),
    "train_style": (Optional[str], typer.Option(None, "--train-style", help="megatron | dtensor")),
    "infer_style": (Optional[str], typer.Option(None, "--infer-style", help="vllm | dtensor")),
    "train_layout": (Optional[str], TRAIN_LAYOUT), "infer_layout": (Optional[str], INFER_LAYOUT),
}


def place(fields: tuple[str, ...], *names: str, after: str) -> tuple[str, ...]:
    """``fields`` with a command's own parameters ``names`` listed after ``after`` (their --help place)."""
    i = fields.index(after) + 1
    return (*fields[:i], *names, *fields[i:])


def refit_options(fields: tuple[str, ...] = PLAN_FIELDS, *, options: dict[str, tuple[Any, Any]] | None = None,
                  given: bool = False) -> Callable:
    """Decorator: the command's ``request`` parameter becomes the options of ``fields`` (from ``options``,
    default ``REQUEST_OPTIONS``), listed in --help where ``request`` stands. A name in ``fields`` that is not
    a request option is one of the command's own parameters, listed there (its place in --help). The command
    receives ``request=RefitRequest(...)`` (fields left out keep the request's defaults), or with ``given``
    the mapping of the options given (not None)."""
    table = options or REQUEST_OPTIONS
    if not given and "train" in fields and "model" in fields and "from_config" not in fields:
        at = fields.index("model")
        fields = (*fields[:at], "from_config", *fields[at:])
        table = {**table, "from_config": (Optional[str], FROM)}

    def wrap(command: Callable) -> Callable:
        sig = inspect.signature(command, eval_str=True)
        own = {n: p for n, p in sig.parameters.items() if n in fields}
        params = [p for p in sig.parameters.values() if p.name not in own]
        at = [p.name for p in params].index("request")
        kind = params[at].kind
        group = [own[f] if f in own else inspect.Parameter(f, kind, default=table[f][1], annotation=table[f][0])
                 for f in fields]
        new = params[:at] + group + params[at + 1:]
        if "from_config" in fields:  # typer hands the click context to a parameter of type typer.Context
            new.append(inspect.Parameter("refit_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        mine = [f for f in fields if f not in own]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {f: kwargs.pop(f) for f in mine}
            if "site" in values and values["site"] is None:  # not given: RESHARDCTL_SITE, the config, local
                values["site"] = choose_site(None).site
            ctx = kwargs.pop("refit_context", None)
            source = values.pop("from_config", None)
            if source is not None:
                from reshardctl.request.from_config import apply_from  # the config readers: only for --from

                values, lines = apply_from(values, source, _given(ctx, values))
                for line in lines:
                    output.err_console().print(line, markup=False, highlight=False, soft_wrap=True)
            if given:
                kwargs["request"] = {k: v for k, v in values.items() if v is not None}
            else:
                kwargs["request"] = RefitRequest(**values)
            return command(**kwargs)

        del run.__wrapped__  # typer and inspect read the signature below, not the command's own
        run.__signature__ = sig.replace(parameters=new)
        run.__annotations__ = {p.name: p.annotation for p in new if p.annotation is not inspect.Parameter.empty}
        return run

    return wrap


def _given(ctx: Any, values: dict[str, Any]) -> set[str]:
    """The options of ``values`` given on the command line (or in the environment), not defaulted; without
    a context (a direct call), those whose value is not the option's default."""
    if ctx is None:
        return {n for n, v in values.items() if n in REQUEST_OPTIONS and v != REQUEST_OPTIONS[n][1].default}
    out = set()
    for name in values:
        src = ctx.get_parameter_source(name)
        if src is not None and getattr(src, "name", "") not in ("DEFAULT", "DEFAULT_MAP"):
            out.add(name)
    return out


__all__ = ["REQUEST_OPTIONS", "RUNBOOK_OPTIONS", "refit_options"]
