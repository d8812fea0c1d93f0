"""The PAU benchmark data: sources, anonymisation, filters, validators, inputs and splits.

Building records (this package never imports JAX)::

    from pau_jax.data import benchmark, sources

    paths = sources.locate("/path/to/sources", [f.key for f in sources.SOURCE_FILES])
    results = benchmark.build_splits(paths, benchmark.DEBUG)   # {"test": ..., "train": ...}
    results["test"].records[0].code                            # test_func with its validator
    results["test"].report()                                   # counts, exclusions, coverage

The TFDS builder in data_builders/pau wraps `benchmark.build_splits`; `build_tfds` runs it
without the `tfds` command line, and `export` writes a built split as Hugging Face parquet.
"""
