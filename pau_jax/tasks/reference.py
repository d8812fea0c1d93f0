"""What is known about a task beyond what its agent sees: one type for the critic, teacher and grader."""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskReference:
    """The privileged information about one task.

    The critic reads ``description`` (and ``code`` when it is shown the source),
    a privileged teacher the same two, and scoring all of it.

    Attributes:
      description: the gold description ('' when there is none).
      code: the true function's source.
      header: the anonymised signature.
      held_out: E_test argument tuples.
      held_out_outputs: the true return value on each of `held_out`, as stored in
        the dataset (code match compares with these); None runs the true function
        at scoring time instead.
      examples: the shown examples as `call -> result` lines (given to the coder in the
        with-observations variant, before the episode's own calls).
      source: the benchmark the task comes from (copied into scored records).
      description_origin: where ``description`` comes from (the dataset's field: the
        benchmark's own text, or a model's, verified or not; copied into scored records so
        judge scores can be read by origin).
    """

    description: str
    code: str = ""
    header: str = ""
    held_out: tuple[tuple, ...] = ()
    held_out_outputs: tuple | None = None
    examples: tuple[str, ...] = ()
    source: str = ""
    description_origin: str = ""
