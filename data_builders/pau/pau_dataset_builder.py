"""pau dataset: PAU tasks built from CRUXEval, MBPP and HumanEval (no TensorFlow needed)."""

import os
import socket
import urllib.parse

import tensorflow_datasets as tfds

from pau_jax.data import benchmark, instruct_sources, records, sources
from pau_jax.data.annotate import AnnotatorConfig

# Set to 1 to read the instruction datasets from the Hugging Face hub when they are not in
# the manual directory.
_FROM_HUB = "PAU_INSTRUCT_FROM_HUB"
_HOMEPAGE = "https://github.com/google-research/google-research/tree/master/mbpp"


def _manual_instructions() -> str:
    lines = ["Put these files (unmodified) in the manual directory:"]
    lines += [f"  {f.filename}  from {f.url}" for f in sources.SOURCE_FILES]
    lines += [f"Optionally, for the train split (or set {_FROM_HUB}=1 to read them from the hub):"]
    lines += [
        f"  {s.local_filename}  (the train split of {s.hub_id})"
        for s in instruct_sources.INSTRUCT_SOURCES.values()
    ]
    return "\n".join(lines)


class Builder(tfds.core.GeneratorBasedBuilder):
    """PAU benchmark: anonymised functions, validators, shown and held-out examples."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "AST anonymisation, synthesised validators, coverage-guided E_test."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(
            name="default",
            description=(
                "All 1221 test candidates; train: MBPP's train part, plus CodeAlpaca-20k and "
                "Magicoder-OSS-Instruct-75K when available (manual_dir, or the hub with "
                f"{_FROM_HUB}=1)."
            ),
        ),
        tfds.core.BuilderConfig(
            name="debug", description="10 candidates per source, smaller search: seconds to build."
        ),
    ]
    DEFAULT_CONFIG_NAME = "default"
    MANUAL_DOWNLOAD_INSTRUCTIONS = _manual_instructions()

    def __init__(self, *, file_format=None, **kwargs):
        # array_record is the only format that TFDS writes without TensorFlow.
        super().__init__(file_format=file_format or "array_record", **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=records.features(),
            homepage=_HOMEPAGE,
            metadata=tfds.core.MetadataDict(),
        )

    def _manual_dir(self, dl_manager):
        try:
            return dl_manager.manual_dir
        except AssertionError:
            return None

    def _source_paths(self, dl_manager):
        keys = [f.key for f in sources.SOURCE_FILES]
        manual_dir = self._manual_dir(dl_manager)
        if manual_dir is not None:
            return sources.locate(manual_dir, keys, strict=False)
        urls = {f.key: f.url for f in sources.SOURCE_FILES}
        names = ", ".join(f.filename for f in sources.SOURCE_FILES)
        for url in urls.values():
            host = urllib.parse.urlparse(url).hostname
            try:
                socket.getaddrinfo(host, 443)
            except OSError as e:
                # Offline: fail at once rather than after the downloader's retries.
                raise sources.SourceError(
                    f"cannot reach {host} to download the source files; put {names} in a "
                    "folder and pass it as --manual_dir (see docs/dataset.md)"
                ) from e
        try:
            downloaded = dl_manager.download(urls)
        except Exception as e:  # Any download failure gets the same one-line remedy.
            raise sources.SourceError(
                f"could not download the source files ({type(e).__name__}); put {names} in a "
                "folder and pass it as --manual_dir (see docs/dataset.md)"
            ) from e
        return {key: downloaded[key] for key in keys}

    def _split_generators(self, dl_manager):
        paths = self._source_paths(dl_manager)
        config = benchmark.CONFIGS[self.builder_config.name]
        results = benchmark.build_splits(
            paths,
            config,
            annotator_config=AnnotatorConfig.from_env(),
            manual_dir=self._manual_dir(dl_manager),
            instruct_from_hub=os.environ.get(_FROM_HUB, "") == "1",
        )
        for name, result in results.items():
            self.info.metadata[f"{name}_report"] = result.report()
        return {name: self._generate_examples(result) for name, result in results.items()}

    def _generate_examples(self, result):
        for record in result.records:
            yield record.task_id, records.to_example(record)
