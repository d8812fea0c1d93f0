"""`tfds build` without TensorFlow: runs the stock TFDS build command on array_record output.

The stock `tfds` executable imports TensorFlow (and mlcroissant) for commands other than
`build`; this entry point runs only TFDS's own `build` command, with the same arguments::

    cd data_builders
    python -m pau_jax.data.build_tfds pau --manual_dir=/path/to/sources [--config=debug]
"""

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Parses `tfds build` arguments (array_record unless --file_format says otherwise) and builds.

    Args:
      argv: command-line arguments after the program name (default: sys.argv[1:]).
    """
    import simple_parsing
    from absl import logging
    from tensorflow_datasets.scripts.cli import build

    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a.startswith("--file_format") for a in argv):
        argv.append("--file_format=array_record")
    args = simple_parsing.parse(build.Args, args=argv, prog="python -m pau_jax.data.build_tfds")
    logging.set_verbosity(logging.INFO)
    args.execute()


if __name__ == "__main__":
    main()
