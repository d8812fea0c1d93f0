"""Runs sharded train steps and greedy sampling on 8 fake CPU devices; prints one JSON line.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python mesh_checks.py train:2,2,2 sample:2

``train:D,F,T`` runs one train step on a (data, fsdp, tp) mesh and reports the
loss and LoRA differences from the unsharded step plus where the arrays lie;
``memory:D,F,T`` compares the memory tool's per-device parameter and LoRA bytes with
the shards device 0 holds; ``sample:T`` samples greedily with the sampler layout and tp = T (fsdp takes the
remaining devices) and reports whether the tokens equal unsharded sampling.
"""

import json
import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    raise SystemExit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 first")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import parallel_testlib as plib  # noqa: E402
from flax import nnx  # noqa: E402

from pau_jax import parallel  # noqa: E402
from pau_jax.sampling import generate  # noqa: E402
from pau_jax.tools import memory_estimate as memory  # noqa: E402

PROMPTS = [[5, 17, 3, 44, 9], [61, 2], [7, 7, 7, 30, 12, 90, 1], [33]]


def check_train(shape: tuple[int, int, int], arrays, reference, initial) -> dict:
    ref_losses, ref_lora = reference
    data, fsdp, tp = shape
    mesh = parallel.make_mesh(parallel.MeshConfig(data=data, fsdp=fsdp, tp=tp))
    losses, state = plib.train_on_mesh(mesh, arrays, steps=1)
    lora = plib.lora_leaves(state)
    q_b = state.lora["model"]["layers"][0]["self_attn"]["q_proj"]["lora"]["lora_b"][...]
    mu = state.opt_state[1][0].mu["model"]["layers"][0]["self_attn"]["q_proj"]["lora"]["lora_a"]
    return {
        "loss": losses[0],
        "reference_loss": ref_losses[0],
        "max_lora_diff": max(float(np.abs(a - b).max()) for a, b in zip(lora, ref_lora)),
        "max_lora_change": max(float(np.abs(a - b).max()) for a, b in zip(lora, initial)),
        "lora_b_spec": str(q_b.sharding.spec),
        "adam_mu_spec": str(mu[...].sharding.spec),
    }


def check_sample(tp: int, model_factory) -> dict:
    kwargs = dict(max_new_tokens=12, temperature=0.0, n_samples=2)
    expected = generate(model_factory(), PROMPTS, **kwargs)
    mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=-1, tp=tp))
    model = model_factory()
    seconds = parallel.reshard(model, mesh, parallel.SAMPLER_RULES)
    got = generate(model, PROMPTS, **kwargs)
    up = model.model.layers[0].mlp.up_proj.kernel[...]
    return {
        "same_tokens": got.tokens == expected.tokens,
        "tokens": got.tokens,
        "max_logprob_diff": max(
            float(np.abs(a - b).max()) for a, b in zip(got.logprobs, expected.logprobs)
        ),
        "up_proj_spec": str(up.sharding.spec),
        "reshard_seconds": seconds,
    }


def check_memory(shape: tuple[int, int, int]) -> dict:
    data, fsdp, tp = shape
    mesh_config = parallel.MeshConfig(data=data, fsdp=fsdp, tp=tp)
    model = parallel.shard_model(plib.lib.tiny_model(), parallel.make_mesh(mesh_config))
    device = jax.devices()[0]

    def on_device(tree) -> int:
        return sum(
            s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
            if s.device == device
        )  # fmt: skip

    est = memory.estimate(
        plib.CONFIG, mesh_config, num_devices=8, batch=8, seq_len=16,
        lora_rank=plib.lib.RANK, dtype="float32",
    )  # fmt: skip
    return {
        "params": on_device(nnx.state(model, nnx.Not(nnx.LoRAParam))),
        "estimated_params": est.params,
        "lora": on_device(nnx.state(model, nnx.LoRAParam)),
        "estimated_lora": est.lora,
    }


def main(argv: list[str]) -> None:
    results = {}
    arrays = plib.batch_arrays()
    initial = plib.lora_leaves(plib.learner.init_state(plib.lib.tiny_model(), plib.LEARNER))
    reference = None
    for arg in argv:
        kind, _, value = arg.partition(":")
        if kind == "train":
            reference = reference or plib.train_unsharded(arrays, steps=1)
            shape = tuple(int(v) for v in value.split(","))
            results[arg] = check_train(shape, arrays, reference, initial)
        elif kind == "memory":
            results[arg] = check_memory(tuple(int(v) for v in value.split(",")))
        elif kind == "sample":
            results[arg] = check_sample(int(value), plib.lib.tiny_model)
        else:
            raise SystemExit(f"unknown check {arg!r}")
    print(json.dumps({"devices": jax.device_count(), "results": results}))


if __name__ == "__main__":
    main(sys.argv[1:])
