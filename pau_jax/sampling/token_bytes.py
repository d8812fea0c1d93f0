"""Each token id's bytes, the alphabet a token automaton (`constraint`) walks.

`vocabulary(tokenizer)` reads them from a Hugging Face tokenizer (byte-level BPE through
GPT-2's byte alphabet, else SentencePiece pieces); special and added tokens have none
(never allowed). A `Vocabulary` carries a fingerprint computed once, the key under which
`constraint` caches the automata built over it.
"""

import hashlib
from collections.abc import Sequence


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (printable bytes are themselves)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in kept]
    out = {chr(b): b for b in kept}
    out.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return out


class Vocabulary:
    """Each token id's bytes (None: never allowed), with a fingerprint computed once.

    Automata are cached per fingerprint, so a policy that keeps its `Vocabulary` looks
    them up without hashing 150k tokens on every call.
    """

    def __init__(self, pieces: Sequence[bytes | None]):
        self.pieces = tuple(pieces)
        digest = hashlib.sha1()
        for piece in self.pieces:
            digest.update(b"\xff" if piece is None else len(piece).to_bytes(4, "little") + piece)
        self.fingerprint = digest.hexdigest()

    def __len__(self) -> int:
        return len(self.pieces)

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and other.fingerprint == self.fingerprint


def vocabulary(tokenizer) -> Vocabulary:
    """Each token id's bytes (None for added/special tokens), for a Hugging Face tokenizer.

    Byte-level BPE tokens (GPT-2 / Qwen) are mapped back through the byte alphabet;
    other tokens are read as SentencePiece pieces (`▁` is a space, `<0xNN>` a byte).
    """
    decode = _byte_alphabet()
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    byte_level = "ByteLevel" in type(tokenizer.backend_tokenizer.decoder).__name__ or (
        "ByteLevel" in str(tokenizer.backend_tokenizer.decoder)
    )
    out: list[bytes | None] = []
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in special or piece is None:
            out.append(None)
        elif byte_level:
            out.append(bytes(decode[c] for c in piece) if all(c in decode for c in piece) else None)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return Vocabulary(out)
