"""Options shared by `plan`, `run`, `bench` and `layout` (one definition, one help text).

Placeholders name what to give (``SPEC``, ``FILE``, ``N``); ``cli._placeholders`` fills in the rest and
blanks them for flags. ``--layers`` has no typer range: ``0`` is refused by the model catalog with the
same message in every command.
"""

from __future__ import annotations

import typer

SITE = typer.Option("local", "--site", metavar="NAME|FILE", help="Site profile name or file.")
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
JSON = typer.Option(False, "--json", help="Print only the JSON report on stdout (errors too, as JSON).")
