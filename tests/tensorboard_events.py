"""TensorBoard scalars read back from a run directory's event files (the TFRecord framing)."""

import pathlib
import struct

from tensorboardX.proto import event_pb2


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] over every ``events.out.tfevents.*`` file of ``run_dir``.

    Files are read in name order; every record's length and the whole file are checked.
    """
    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(pathlib.Path(run_dir).glob("events.out.tfevents.*"))
    assert files, f"no event file in {run_dir}"
    for path in files:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            assert len(payload) == length, f"{path} ends inside a record"
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
