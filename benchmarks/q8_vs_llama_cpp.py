"""Batch-1 greedy decode of SmolLM2-135M-Instruct: pau_jax with 8-bit decode weights against llama.cpp's Q8_0.

Both sides decode the same prompt greedily on the same machine in one run, rounds
interleaved (the side that goes first alternates). pau_jax: `generate` on the converted
checkpoint with `quantization.quantize_for_decode(model, "q8")` (and float32, for
reference); tokens/s is new tokens over the decode loop's seconds (prefill excluded).
llama.cpp: llama-cpp-python on a Q8_0 GGUF of the same checkpoint (written once with
llama.cpp's own `convert_hf_to_gguf.py --outtype q8_0`), 2 threads; tokens/s over the
time from the first to the last generated token (prefill excluded). llama-cpp-python is an
optional dependency of this benchmark only, built from source so that it targets this CPU:

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36   (about 10 min on 2 cores)

Its sdist carries `vendor/llama.cpp/convert_hf_to_gguf.py`; pass that file with
`--convert_script` (or an existing Q8_0 GGUF with `--gguf`). llama.cpp may run from another
virtualenv (`--llama_python`): its side then runs in a child process per round.

Usage (from the repository root):

    python benchmarks/q8_vs_llama_cpp.py --convert_script /path/to/convert_hf_to_gguf.py \
        [--llama_python /path/to/venv/bin/python] [--rounds 3] [--new_tokens 128]

The last line is `ours_over_llama_cpp_b1=... noisy=0|1` (q8 tokens/s over llama.cpp's).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax import models  # noqa: E402
from pau_jax.kernels import build  # noqa: E402
from pau_jax.models import quantization  # noqa: E402
from pau_jax.sampling import generate  # noqa: E402
from pau_jax.tokenizer import load_tokenizer  # noqa: E402
from pau_jax.tools import fetch  # noqa: E402

MAX_LOAD = 0.5
MAX_SPREAD = 0.2
PROMPT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]

# Run by the llama.cpp side's interpreter: prints {"tokens_per_s": ..., "tokens": [...]}.
_LLAMA_SIDE = r"""
import json, sys, time
from llama_cpp import Llama
path, new, prompt = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llm = Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=1024, verbose=False)
def once():
    llm.reset()
    out, first, last = [], None, None
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        now = time.perf_counter()
        first = now if first is None else first
        last = now
        out.append(int(token))
        if len(out) == new:
            break
    return (len(out) - 1) / (last - first), out
once()  # warm up
rate, tokens = once()
print(json.dumps({"tokens_per_s": rate, "tokens": tokens}))
"""


def _gguf(args, checkpoint: str) -> str:
    if args.gguf:
        return args.gguf
    out = os.path.join(tempfile.mkdtemp(), "smollm2-q8_0.gguf")
    subprocess.run(
        [sys.executable, args.convert_script, checkpoint, "--outtype", "q8_0", "--outfile", out],
        check=True,
        capture_output=True,
    )
    return out


def _ours(model, prompt, new_tokens):
    out = generate(model, [prompt], max_new_tokens=new_tokens)
    return new_tokens / out.decode_seconds, out.tokens[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--convert_script", help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--gguf", help="an existing Q8_0 GGUF of the checkpoint")
    parser.add_argument("--llama_python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new_tokens", type=int, default=128)
    args = parser.parse_args()
    if not (args.gguf or args.convert_script):
        parser.error("pass --convert_script (llama.cpp's convert_hf_to_gguf.py) or --gguf")

    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"q8 kernel: {build.instructions() if build.available() else 'unavailable'}")
    checkpoint = fetch.checkpoint("smollm2-135m-instruct")
    gguf = _gguf(args, checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    f32, _ = models.load_hf(checkpoint)
    q8, _ = models.load_hf(checkpoint)
    quantization.quantize_for_decode(q8, "q8")
    for model in (f32, q8):
        _ours(model, prompt, args.new_tokens)  # compile

    def llama():
        proc = subprocess.run(
            [args.llama_python, "-c", _LLAMA_SIDE, gguf, str(args.new_tokens), json.dumps(prompt)],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        return result["tokens_per_s"], result["tokens"]

    sides = {"pau_jax q8": lambda: _ours(q8, prompt, args.new_tokens), "llama.cpp Q8_0": llama}
    sides["pau_jax float32"] = lambda: _ours(f32, prompt, args.new_tokens)
    rates = {name: [] for name in sides}
    tokens = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            rate, toks = sides[name]()
            rates[name].append(rate)
            tokens[name] = toks
    print(f"\n{'side':<16} {'tokens/s (median)':>18} {'rounds':>30}")
    for name, values in rates.items():
        print(
            f"{name:<16} {statistics.median(values):>18.1f} {str([round(v, 1) for v in values]):>30}"
        )
    per_round = [a / b for a, b in zip(rates["pau_jax q8"], rates["llama.cpp Q8_0"])]
    ratio = statistics.median(per_round)
    spread = (max(per_round) - min(per_round)) / ratio
    same = next(
        (
            i
            for i, (a, b) in enumerate(zip(tokens["pau_jax q8"], tokens["llama.cpp Q8_0"]))
            if a != b
        ),
        min(len(tokens["pau_jax q8"]), len(tokens["llama.cpp Q8_0"])),
    )
    print(f"greedy tokens identical (q8 vs llama.cpp) before the first difference: {same}")
    end = os.getloadavg()
    print(f"load average at end: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")
    noisy = load[0] > MAX_LOAD or spread > MAX_SPREAD
    print(f"ours_over_llama_cpp_b1={ratio:.3f} spread={spread:.2f} noisy={int(noisy)}")


if __name__ == "__main__":
    main()
