"""Options shared by `plan`, `run` and `bench` (one definition, one help text)."""

from __future__ import annotations

import typer

SITE = typer.Option("local", "--site", help="Site profile name or file.")
MODEL = typer.Option("tiny-llama", "--model", "-m", help="Preset name or path (config.json / index / directory).")
LAYERS = typer.Option(None, "--layers", min=1, help="Keep only the first N decoder layers.")
TRAIN = typer.Option(None, "--train", help='Trainer parallelism, e.g. "tp=4,pp=2" (default tp=2,dp=2).')
INFER = typer.Option(None, "--infer", help='Inference parallelism, e.g. "tp=8,dp=2" (default tp=2,dp=2).')
TRAIN_STYLE = typer.Option("megatron", "--train-style", help="megatron | dtensor")
INFER_STYLE = typer.Option("vllm", "--infer-style", help="vllm | sglang | dtensor")
MTP = typer.Option(False, "--mtp", help="Include the model's MTP layers (DeepSeek num_nextn_predict_layers) in both "
                   "layouts: Megatron mtp.layers.{k}, the vLLM MTP draft (not with --layers).")
TRAIN_LAYOUT = typer.Option(None, "--train-layout", help="Trainer layout file (overrides --train).")
INFER_LAYOUT = typer.Option(None, "--infer-layout", help="Inference layout file (overrides --infer).")
BUCKET_MB = typer.Option(None, "--bucket-mb", help="Bucket / round bound in MiB (default: the profile's refit.bucket_mb).")
RELAY = typer.Option("auto", "--relay", help="Two-stage NVLink fan-out: auto | on | off.")
JSON = typer.Option(False, "--json", help="Print only the JSON report on stdout.")
