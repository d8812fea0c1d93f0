"""all-MiniLM-L6-v2 (a real BERT sentence encoder, from PyPI) as the memory baseline's embedder.

pau_jax's local embedder against transformers' `AutoModel` with sentence-transformers'
mean pooling and normalisation, then the memory baseline's retrieval (`memory.top_k`
over the gold descriptions of the `pau/debug` train split) with it.
"""

import time

import numpy as np
import pytest

from pau_jax.evaluation import memory_baseline as memory
from pau_jax.policy import embeddings
from pau_jax.tasks import pau_dataset
from pau_jax.tools import fetch

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

DESCRIPTIONS = [
    "Returns the sum of two numbers.",
    "Adds two integers together.",
    "Sorts a list in descending order.",
    "Reverses the characters of a string.",
    "Checks whether a number is prime.",
    "Orders the items of a list from largest to smallest.",
    "Counts the vowels in a word.",
    "Returns the string backwards.",
]


@pytest.fixture(scope="module")
def minilm():
    return fetch.ensure("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def embedder(minilm):
    return embeddings.build_embedder(
        embeddings.LocalEmbeddingConfig(checkpoint_dir=str(minilm), batch_size=8)
    )


def _transformers_embeddings(path, texts):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    weight = batch["attention_mask"][..., None].float()
    mean = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def test_minilm_embeds_as_transformers_and_finds_paraphrases(minilm, embedder):
    assert embedder.max_length == 512 and not embedder.pad_left
    ours = embedder.embed(DESCRIPTIONS)
    theirs = _transformers_embeddings(minilm, DESCRIPTIONS)
    assert ours.shape == (len(DESCRIPTIONS), 384)
    difference = float(np.abs(ours - theirs).max())
    print(f"max |pau_jax - transformers| = {difference:.2e}")
    assert difference < 1e-5
    similarity = ours @ ours.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = {DESCRIPTIONS[i]: DESCRIPTIONS[j] for i, j in enumerate(similarity.argmax(1))}
    assert nearest["Returns the sum of two numbers."] == "Adds two integers together."
    assert nearest["Sorts a list in descending order."] == (
        "Orders the items of a list from largest to smallest."
    )
    assert nearest["Reverses the characters of a string."] == "Returns the string backwards."


def test_memory_retrieval_with_minilm_over_the_debug_train_split(embedder, data_dir):
    train = pau_dataset.load_split("debug", "train", data_dir)
    ids = [r.task_id for r in train]
    assert ids == ["MBPP/2", "MBPP/3", "MBPP/4"]  # the debug split's train items
    predictions = {  # first predictions of test tasks, as `run_memory` embeds them
        "shared": "Returns the elements that appear in both of two tuples.",
        "primes": "Tells whether a number is not a prime.",
        "heap": "Returns the n biggest values in a list of numbers.",
        "empty": memory.EMPTY_PREDICTION,
    }
    start = time.perf_counter()
    keys = embedder.embed([r.description for r in train])
    order, scores = memory.top_k(embedder.embed(list(predictions.values())), keys, k=5)
    print(f"memory retrieval with all-MiniLM-L6-v2: {time.perf_counter() - start:.2f} s")
    assert order.shape == scores.shape == (len(predictions), len(train))  # k > N: all N
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert sorted(order[-1]) == [0, 1, 2]  # an empty prediction still retrieves every item
    named = list(predictions)[:-1]
    best = {name: ids[row[0]] for name, row in zip(named, order[:-1], strict=True)}
    assert best == {"shared": "MBPP/2", "primes": "MBPP/3", "heap": "MBPP/4"}
