"""Serve a local checkpoint over the OpenAI chat API, from the command line.

    python -m pau_jax.tools.serve ~/.cache/pau_jax/qwen2.5-coder-1.5b-instruct \
        --name qwen2.5-coder-1.5b-instruct --port 8000 --decode_weights q8

One line on stdout once the server listens (``serving <names> at <base URL>``), then
requests until Ctrl-C or SIGTERM, which stop it with one line and exit status 0. The
server is `policy.server.PolicyServer` over a `LocalPolicy` (`policy.backends.
LocalBackendConfig`): concurrent requests share sampler batches, bad requests get a 4xx
with one line, a model name not served gets a 404. It binds 127.0.0.1 unless ``--host``
says otherwise; the API key comes from ``PAU_SERVER_API_KEY`` (preferred: a key on the
command line is visible to every user of the machine in the process list) or
``--api_key``. Any OpenAI client can then use the model as judge, coder, annotator
(``PAU_ANNOTATOR_BASE_URL``) or policy (``HTTPBackendConfig``).
"""

import argparse
import logging
import pathlib
import signal
import sys
import threading

from pau_jax.policy import backends
from pau_jax.policy.config import DECODE_WEIGHTS, SamplingConfig
from pau_jax.policy.server import PolicyServer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.tools.serve", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("checkpoint", help="Hugging Face checkpoint folder (config.json, safetensors, tokenizer)")
    add("--name", action="append", help="served model name (repeat for aliases); default: folder")
    add("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    add("--port", type=int, default=8000, help="port (0: a free one, printed)")
    add("--api_key", default=None, help="bearer key; default $PAU_SERVER_API_KEY, else none")
    add("--adapter_dir", default=None, help="a PEFT LoRA adapter folder added to the model")
    add("--dtype", default="float32", help="parameter dtype")
    add("--decode_weights", choices=DECODE_WEIGHTS, default="float32", help="decode weights")
    add("--prefix_cache_gib", type=float, default=1.0, help="prefix-cache memory (0: none)")
    add("--max_batch", type=int, default=16, help="requests per sampler batch")
    add("--max_tokens_limit", type=int, default=4096, help="largest max_tokens a request may ask")
    add("--max_context_tokens", type=int, default=None, help="prompt + max_tokens limit")
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.checkpoint).expanduser()
    if not (folder / "config.json").is_file():
        parser.error(f"{folder} has no config.json: pass a Hugging Face checkpoint folder")
    if args.max_batch < 1 or args.max_tokens_limit < 1:
        parser.error("--max_batch and --max_tokens_limit must be >= 1")
    args.checkpoint = str(folder)
    args.name = args.name or [folder.name]
    return args


def build_server(args: argparse.Namespace) -> PolicyServer:
    """The (not yet started) server the arguments describe."""
    policy = backends.build_policy(
        backends.LocalBackendConfig(
            checkpoint_dir=args.checkpoint,
            sampling=SamplingConfig(),
            adapter_dir=args.adapter_dir,
            dtype=args.dtype,
            prefix_cache_gib=args.prefix_cache_gib,
            decode_weights=args.decode_weights,
        )
    )
    return PolicyServer(
        policy,
        model_name=args.name,
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_tokens_limit=args.max_tokens_limit,
        max_context_tokens=args.max_context_tokens,
        api_key=args.api_key,
    )


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="[serve] %(message)s")
    args = parse_args(argv)
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    server = build_server(args).start()
    keyed = "with an API key" if server.api_key else "without an API key"
    print(f"serving {', '.join(args.name)} at {server.base_url} ({keyed})", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    print(f"stopped after {len(server.batch_sizes)} sampler batches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
