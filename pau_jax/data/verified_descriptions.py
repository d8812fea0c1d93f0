"""Gold descriptions a model wrote and execution verified, shipped beside this module.

CRUXEval's functions come without a description, so the judge cannot score those items.
`FILE` (``verified_descriptions.jsonl``) holds, per item, a description an annotator model
wrote from the code (`data.annotate`'s prompt) that was kept only because a coder, given
the description and the signature alone, wrote code that matched a majority of the item's
held-out examples (`python -m pau_jax.tools.verify_descriptions` writes it). The builder
gives these to records without a description (`fill`), keyed by task id and the sha256 of
the item's original code, so a changed source never gets a stale description, and records
their provenance in ``description_origin``: ``annotator:<model> verified <k>/<n>``. No
network is needed: the file is part of the package.
"""

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import tempfile
from collections.abc import Iterable, Sequence

FILE = pathlib.Path(__file__).with_name("verified_descriptions.jsonl")
FIELDS = ("task_id", "code_sha256", "description", "annotator", "matched", "held_out")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedDescription:
    """One kept description and how it was verified.

    Attributes:
      task_id: the benchmark item (e.g. ``CRUXEval/sample_12``).
      code_sha256: sha256 of the item's original code (UTF-8) the description was written from.
      description: the description.
      annotator: the model that wrote it.
      matched, held_out: held-out examples the coder's code matched, of those compared.
    """

    task_id: str
    code_sha256: str
    description: str
    annotator: str
    matched: int
    held_out: int

    def __post_init__(self):
        if not self.description.strip():
            raise ValueError(f"{self.task_id}: empty description")
        if not 0 <= self.matched <= self.held_out or 2 * self.matched <= self.held_out:
            raise ValueError(
                f"{self.task_id}: matched {self.matched} of {self.held_out} held-out examples "
                "is not a majority; only verified descriptions are kept"
            )

    @property
    def origin(self) -> str:
        """The record's ``description_origin``."""
        return f"annotator:{self.annotator} verified {self.matched}/{self.held_out}"


def code_sha256(code: str) -> str:
    """The key of an item's code."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def read(path: str | pathlib.Path | None = None) -> dict[str, VerifiedDescription]:
    """Task id -> kept description (default file: `FILE`); {} when the file does not exist.

    Raises:
      ValueError: a line that is not a complete entry (naming the file and line), or a task
        id given twice.
    """
    path = pathlib.Path(FILE if path is None else path)
    if not path.exists():
        return {}
    out: dict[str, VerifiedDescription] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                entry = VerifiedDescription(**{k: row[k] for k in FIELDS})
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}, line {n}: not a verified description ({exc})") from None
            if entry.task_id in out:
                raise ValueError(f"{path}, line {n}: {entry.task_id} is given twice")
            out[entry.task_id] = entry
    return out


def write(path: str | pathlib.Path, entries: Iterable[VerifiedDescription]) -> None:
    """Writes ``entries`` sorted by task id, replacing ``path`` atomically."""
    path = pathlib.Path(path)
    rows = sorted(entries, key=lambda e: e.task_id)
    text = "".join(json.dumps(dataclasses.asdict(e), ensure_ascii=False) + "\n" for e in rows)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def fill(
    records: Sequence, entries: dict[str, VerifiedDescription], *, min_fraction: float = 0.5
) -> tuple:
    """Records without a description get their kept one (same task id and code hash).

    Args:
      records: `pipeline.Record`s (anything with ``task_id``, ``original_code``,
        ``description`` that ``dataclasses.replace`` can copy).
      entries: `read`'s mapping.
      min_fraction: use a description only if its coder matched at least this share of
        the held-out examples (0.5: every kept one, each a majority; 1.0: only those whose
        code matched every held-out example, the strict reading).

    Returns:
      The records, those filled with ``description`` and ``description_origin`` set.
    """
    if not 0.5 <= min_fraction <= 1:
        raise ValueError(f"min_fraction must be in [0.5, 1], got {min_fraction}")
    entries = {k: e for k, e in entries.items() if e.matched / e.held_out >= min_fraction}
    out, stale = [], []
    for record in records:
        entry = entries.get(record.task_id)
        if entry is not None and not record.description:
            if entry.code_sha256 == code_sha256(record.original_code):
                record = dataclasses.replace(
                    record, description=entry.description, description_origin=entry.origin
                )
            else:
                stale.append(record.task_id)
        out.append(record)
    if stale:
        logging.warning(
            "%d verified descriptions were written for other code and are not used "
            "(first: %s); rerun pau_jax.tools.verify_descriptions for them",
            len(stale),
            stale[0],
        )
    return tuple(out)
