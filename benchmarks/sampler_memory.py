"""Resident memory over repeated agent-like calls: with and without the heap release.

Each arm runs in its own process (a fresh heap): a local policy (Qwen2.5-Coder-0.5B, 8-bit
decode, a 2-GiB prefix cache, as `eval/coder_cpu_40.gin`'s agent) answers `--calls` calls of
16 conversations that grow by one reply and one user message per call, as episodes do. After
each call the process records its resident size (VmRSS), the bytes of live JAX arrays
(weights, the prefix cache) and glibc's heap counters (`mallinfo2`). The arm `off` replaces
`sampling.runtime.release_freed_memory` by a no-op (the sampler before it); `on` is the code
as it is. The growth is the resident size after the last call minus after the first.

    python -u benchmarks/sampler_memory.py                     # both arms, one after the other

The last line is `growth_off_gb=... growth_on_gb=... ratio=...` (off / on).
"""

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = "alpha beta gamma delta input output value list string number call result test".split()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def _rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmRSS line")


def arm(release: str, checkpoint: str, calls: int) -> list[dict]:
    """One arm in this process: a row per call."""
    import jax

    from pau_jax.policy import backends
    from pau_jax.policy.config import SamplingConfig
    from pau_jax.sampling import runtime
    from pau_jax.tools.fetch import checkpoint as fetch

    if release == "off":
        runtime.release_freed_memory = lambda: False
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    config = backends.LocalBackendConfig(
        checkpoint_dir=fetch(checkpoint),
        sampling=SamplingConfig(max_new_tokens=64),
        decode_weights="q8",
        prefix_cache_gib=2.0,
    )
    policy = backends.build_policy(config)
    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    conversations = [
        [
            {"role": "system", "content": "You probe an unknown function. " * 20},
            {"role": "user", "content": text(120 + 20 * i)},
        ]
        for i in range(16)
    ]
    rows = []
    for call in range(calls):
        start = time.perf_counter()
        replies = policy.complete(conversations)
        seconds = time.perf_counter() - start
        heap = libc.mallinfo2()
        live = sum(x.nbytes for x in jax.live_arrays()) / 2**30
        rows.append(
            {
                "call": call,
                "rss_gb": round(_rss_gb(), 3),
                "live_arrays_gb": round(live, 3),
                "heap_in_use_gb": round(heap.uordblks / 2**30, 3),
                "heap_free_gb": round(heap.fordblks / 2**30, 3),
                "seconds": round(seconds, 1),
            }
        )
        print(f"[{release}] {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
        for conversation, reply in zip(conversations, replies):
            conversation.append({"role": "assistant", "content": reply.text})
            conversation.append({"role": "user", "content": text(60)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--arm", choices=("on", "off"), help="run one arm here (internal)")
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.checkpoint, args.calls)))
        return
    growth = {}
    for release in ("off", "on"):
        command = [sys.executable, "-u", __file__, "--arm", release]
        command += ["--checkpoint", args.checkpoint, "--calls", str(args.calls)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows = json.loads(out.strip().splitlines()[-1])  # the loader prints lines of its own
        growth[release] = rows[-1]["rss_gb"] - rows[0]["rss_gb"]
        seconds = sum(r["seconds"] for r in rows[1:])
        print(
            f"{release}: rss {rows[0]['rss_gb']:.2f} -> {rows[-1]['rss_gb']:.2f} GB, "
            f"live arrays {rows[-1]['live_arrays_gb']:.2f} GB, heap free {rows[-1]['heap_free_gb']:.2f} GB, "
            f"calls 2..{len(rows)} {seconds:.1f} s",
            flush=True,
        )
    ratio = growth["off"] / max(growth["on"], 0.01)
    print(f"growth_off_gb={growth['off']:.2f} growth_on_gb={growth['on']:.2f} ratio={ratio:.1f}")


if __name__ == "__main__":
    main()
