"""Write gold descriptions for items that have none, and keep those that execution verifies.

    export PAU_ANNOTATOR_BASE_URL=http://127.0.0.1:8000/v1 PAU_ANNOTATOR_MODEL=qwen2.5-coder-1.5b-instruct
    python -m pau_jax.tools.serve ~/.cache/pau_jax/qwen2.5-coder-1.5b-instruct --decode_weights q8 &
    python -m pau_jax.tools.verify_descriptions --config default --source cruxeval --limit 40 \
        --coder_checkpoint ~/.cache/pau_jax/qwen2.5-coder-1.5b-instruct --decode_weights q8

For each record of a built split without a description (CRUXEval's, by default): the
annotator (``PAU_ANNOTATOR_*``, `data.annotate`: any OpenAI-compatible endpoint, such as
`tools.serve`) describes the item's original code; a coder, given only the anonymised
signature and that description (`evaluation.code_match`'s prompt), writes code; the code
runs in the sandbox on the item's held-out inputs. A description is kept when the code
matches a majority of the comparable held-out outputs, and written to
`data.verified_descriptions.FILE` (``--out``) with its provenance; a rejected one goes to
``<out>.rejected.jsonl`` with its count, so a rerun skips it. The next build of the dataset
fills the kept ones in (``description_origin`` ``annotator:<model> verified k/n``).
Resumable: items already in either file are skipped. The last line is ``kept=K of N``.
"""

import argparse
import concurrent.futures
import json
import pathlib
import sys

from pau_jax.data import verified_descriptions as verified
from pau_jax.data.annotate import Annotator, AnnotatorConfig, AnnotatorError
from pau_jax.evaluation import code_match
from pau_jax.policy import backends
from pau_jax.policy.config import DECODE_WEIGHTS, SamplingConfig
from pau_jax.policy.http import HTTPConfig
from pau_jax.sandbox import Executor
from pau_jax.tasks import pau_dataset


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.tools.verify_descriptions", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--data_dir", default="~/tensorflow_datasets", help="TFDS data_dir of the built pau")
    add("--config", default="default", help="builder config of the built split")
    add("--split", default="test", choices=("test", "train"))
    add("--source", default="cruxeval", help="only records of this source ('' for any)")
    add("--limit", type=int, default=None, help="describe at most this many new items")
    add("--out", default=str(verified.FILE), help="the kept descriptions (JSONL)")
    add("--coder_checkpoint", default=None, help="a local coder (Hugging Face folder)")
    add("--decode_weights", choices=DECODE_WEIGHTS, default="float32", help="local coder")
    add("--coder_base_url", default=None, help="or an OpenAI-compatible coder endpoint")
    add("--coder_model", default=None, help="the endpoint's model name")
    add("--coder_tokens", type=int, default=256, help="the coder's reply limit")
    add("--batch", type=int, default=8, help="items per annotator and coder batch (each saved)")
    add("--timeout_s", type=float, default=2.0, help="limit of one sandboxed call")
    args = parser.parse_args(argv)
    if (args.coder_checkpoint is None) == (args.coder_base_url is None):
        parser.error("give the coder: --coder_checkpoint DIR or --coder_base_url URL")
    if args.coder_base_url and not args.coder_model:
        parser.error("--coder_base_url needs --coder_model")
    if args.batch < 1 or (args.limit is not None and args.limit < 0):
        parser.error("--batch must be >= 1 and --limit >= 0")
    return args


def _coder(args: argparse.Namespace):
    """The coder seat: a local checkpoint (greedy, its reply masked to one code block) or an endpoint."""
    if args.coder_checkpoint:
        sampling = SamplingConfig(
            temperature=0.0, max_new_tokens=args.coder_tokens, structured="constrain_inputs"
        )
        config = backends.LocalBackendConfig(
            checkpoint_dir=str(pathlib.Path(args.coder_checkpoint).expanduser()),
            sampling=sampling,
            decode_weights=args.decode_weights,
        )
    else:
        http = HTTPConfig(
            base_url=args.coder_base_url, model=args.coder_model, max_tokens=args.coder_tokens
        )
        config = backends.HTTPBackendConfig(http=http)
    return backends.build_policy(config)


def _rejected_path(out: pathlib.Path) -> pathlib.Path:
    return out.with_name(out.name + ".rejected.jsonl")


def _seen(out: pathlib.Path) -> set[tuple[str, str]]:
    """(task id, code hash) of the items already kept or rejected."""
    seen = {(e.task_id, e.code_sha256) for e in verified.read(out).values()}
    rejected = _rejected_path(out)
    if rejected.exists():
        for line in rejected.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                seen.add((row["task_id"], row["code_sha256"]))
    return seen


def verify(records, described: dict[str, str], coder, executor, timeout_s: float):
    """(matched, compared) per record: the coder's code from its description alone, run on E_test."""
    conversations = [code_match.coder_messages(r.header, described[r.task_id]) for r in records]
    codes = code_match.write_code(coder, conversations)
    out = []
    for record, code in zip(records, codes, strict=True):
        reference = pau_dataset.to_reference(record)
        match = code_match.score_code(
            executor,
            record.code,
            code,
            list(reference.held_out),
            timeout_s=timeout_s,
            expected_outputs=reference.held_out_outputs,
        )
        compared = len(reference.held_out) - match.incomparable
        out.append((sum(match.matches), compared))
    return out


def _describe(annotator: Annotator, records) -> dict[str, str]:
    """task id -> description of each record the annotator describes; its requests are sent
    at once, so a batching server (`tools.serve`) answers them in one batch."""
    described = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(records))) as pool:
        futures = [pool.submit(annotator.describe, r.original_code) for r in records]
        for record, future in zip(records, futures, strict=True):
            try:
                described[record.task_id] = future.result()
            except AnnotatorError as exc:
                print(f"[verify] {record.task_id}: no description ({exc})", flush=True)
    return described


def main(argv=None) -> int:
    args = parse_args(argv)
    annotator_config = AnnotatorConfig.from_env()
    if annotator_config is None:
        sys.exit("set PAU_ANNOTATOR_BASE_URL and PAU_ANNOTATOR_MODEL (see data/annotate.py)")
    annotator = Annotator(annotator_config)
    out = pathlib.Path(args.out).expanduser()
    records = pau_dataset.load_split(args.config, args.split, args.data_dir)
    seen = _seen(out)
    todo = [
        r
        for r in records
        if not r.description
        and (not args.source or r.source == args.source)
        and (r.task_id, verified.code_sha256(r.original_code)) not in seen
    ][: args.limit]
    print(f"[verify] {len(todo)} items to describe ({len(seen)} done before)", flush=True)
    coder, kept_now, tried = _coder(args), 0, 0
    with Executor(workers=2) as executor:
        for start in range(0, len(todo), args.batch):
            chunk = todo[start : start + args.batch]
            described = _describe(annotator, chunk)
            chunk = [r for r in chunk if r.task_id in described]
            counts = verify(chunk, described, coder, executor, args.timeout_s)
            kept, rejected = _sort(chunk, described, counts, annotator_config.model)
            verified.write(out, [*verified.read(out).values(), *kept])
            with open(_rejected_path(out), "a", encoding="utf-8") as f:
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rejected)
            kept_now, tried = kept_now + len(kept), tried + len(chunk)
            print(f"[verify] {start + len(chunk)}/{len(todo)}: kept {kept_now} of {tried}")
    print(f"kept={kept_now} of {tried}", flush=True)
    return 0


def _sort(records, described, counts, model: str):
    """(kept entries, rejected rows) of a verified chunk."""
    kept, rejected = [], []
    for record, (matched, compared) in zip(records, counts, strict=True):
        row = {
            "task_id": record.task_id,
            "code_sha256": verified.code_sha256(record.original_code),
            "description": described[record.task_id],
            "annotator": model,
            "matched": matched,
            "held_out": compared,
        }
        if compared and 2 * matched > compared:
            kept.append(verified.VerifiedDescription(**row))
        else:
            rejected.append(row)
    return kept, rejected


if __name__ == "__main__":
    sys.exit(main())
