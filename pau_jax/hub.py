"""Checkpoints named by a Hugging Face repo id (``Qwen/Qwen3-8B``) instead of a directory.

``resolve`` returns a directory for either: an existing path as it is, a repo id
as its snapshot in the Hugging Face cache, downloaded first when the hub can be
reached (only the files a checkpoint needs: config, safetensors, tokenizer). With
``HF_HUB_OFFLINE=1``, or with no route to the hub, a repo id that is not in the
cache fails with one line saying so. The cache is the one ``huggingface_hub``
uses (``HF_HUB_CACHE``, or ``HF_HOME``/hub, or ``~/.cache/huggingface/hub``).

``checkpoint_problem`` says, without loading anything, why a checkpoint would not
load (a missing folder, no config.json, weights missing or cut short); the
launcher's ``--dry_run`` asks it of every checkpoint a run names.
"""

import json
import os
import pathlib
import re
import struct

# owner/name, as the hub spells repo ids (no leading dot or slash, one slash).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# What a checkpoint directory needs; weights in other formats (.bin, .gguf, .pt) are not fetched.
CHECKPOINT_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
_TRUE = ("1", "ON", "YES", "TRUE")
# The largest header the safetensors format allows.
_MAX_HEADER = 100_000_000


class HubError(FileNotFoundError):
    """A repo id that could not be turned into a checkpoint directory; the message is one line."""


def is_repo_id(name: str | os.PathLike) -> bool:
    """Whether ``name`` reads as a hub repo id rather than a path (an existing path never does)."""
    text = os.fspath(name)
    return bool(_REPO_ID.match(text)) and not pathlib.Path(text).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().upper() in _TRUE


def _cache_dir() -> str | None:
    """The hub cache from the environment at call time (None: huggingface_hub's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def resolve(name: str | os.PathLike) -> pathlib.Path:
    """The checkpoint directory of a path or a hub repo id.

    Args:
      name: a directory (returned as it is, ``~`` expanded, whether or not it exists, so
        the caller's own not-found message applies), or a repo id such as ``Qwen/Qwen3-8B``.

    Returns:
      A directory path.

    Raises:
      HubError: a repo id that is neither in the cache nor downloadable now.
    """
    if not is_repo_id(name):
        return pathlib.Path(name).expanduser()
    repo_id = os.fspath(name)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = _offline()
    try:
        path = snapshot_download(
            repo_id,
            cache_dir=_cache_dir(),
            allow_patterns=list(CHECKPOINT_PATTERNS),
            local_files_only=offline,
        )
    except LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE=1 is set" if offline else "the hub cannot be reached"
        raise HubError(
            f"{repo_id} is not a directory and not in the Hugging Face cache "
            f"({_cache_dir() or '~/.cache/huggingface/hub'}), and {how}; download it where "
            "the hub is reachable (`hf download " + repo_id + "`) or pass a checkpoint directory"
        ) from None
    except HfHubHTTPError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HubError(f"could not fetch {repo_id} from the Hugging Face hub: {first}") from None
    return pathlib.Path(path)


def whole_safetensors(path: str | os.PathLike) -> bool:
    """Whether a safetensors file is as long as its header says (reads the header only)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return False
        (size,) = struct.unpack("<Q", head)
        if size > min(_MAX_HEADER, os.fstat(f.fileno()).st_size):  # Garbage, not a length.
            return False
        header = f.read(size)
    if len(header) < size:
        return False
    try:
        tensors = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    if not isinstance(tensors, dict):
        return False
    try:
        end = max(
            (t["data_offsets"][1] for name, t in tensors.items() if name != "__metadata__"),
            default=0,
        )
    except (KeyError, IndexError, TypeError):
        return False
    return os.stat(path).st_size == 8 + size + end


def checkpoint_problem(name: str | os.PathLike) -> str | None:
    """Why the checkpoint ``name`` (a directory or a repo id) would not load; None when it would.

    Cheap: reads config.json and the weights' headers, not the weights. A repo id is
    looked up in the hub cache only when the hub is off (``HF_HUB_OFFLINE=1``);
    otherwise it is downloaded when the run starts.
    """
    if is_repo_id(name):
        if not _offline():
            return None
        try:
            folder = resolve(name)
        except HubError as e:
            return str(e)
    else:
        folder = pathlib.Path(name).expanduser()
    if not folder.is_dir():
        return f"checkpoint {folder} is not a directory"
    config = folder / "config.json"
    if not config.is_file():
        return f"checkpoint {folder} has no config.json (not a Hugging Face model directory)"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{config} is not valid JSON (cut short?)"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError):
            return f"{index} is not a valid index (cut short?)"
        weights = [folder / shard for shard in shards]
    else:
        weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return f"checkpoint {folder} holds no *.safetensors weights"
    for file in weights:
        if not file.is_file():
            return f"checkpoint {folder} lacks {file.name}, named by its index"
        if not whole_safetensors(file):
            return f"{file} is cut short or not a safetensors file"
    return None
