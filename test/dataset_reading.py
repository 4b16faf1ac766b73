"""An independent reader of LeRobotDataset v3.0 folders for the tests: pyarrow and PyAV only, nothing of
vla_policy_node.dataset, written from lerobot's layout (lerobot 7427f318 datasets/utils.py, dataset_reader.py).

And the bag side, read as plainly: what the node would have seen at each tick, from the messages themselves.
"""
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

NS = 1_000_000_000


def info(root):
    return json.loads((Path(root) / 'meta' / 'info.json').read_text())


def stats(root):
    return json.loads((Path(root) / 'meta' / 'stats.json').read_text())


def conversion(root):
    return json.loads((Path(root) / 'meta' / 'vla_policy_node_conversion.json').read_text())


def frames_table(root):
    """Every data/*/*.parquet file, concatenated in file order, as a dict of numpy arrays."""
    tables = [pq.read_table(path) for path in sorted((Path(root) / 'data').glob('*/*.parquet'))]
    table = pa.concat_tables(tables)
    columns = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type):
            columns[name] = np.asarray(column.to_pylist())
        else:
            columns[name] = column.to_numpy()
    return columns


def episodes_table(root):
    paths = sorted((Path(root) / 'meta' / 'episodes').glob('*/*.parquet'))
    return pa.concat_tables([pq.read_table(path) for path in paths]).to_pylist()


def tasks(root):
    """task_index -> task, read as lerobot reads meta/tasks.parquet (lerobot 7427f318 io_utils.load_tasks:
    ``pd.read_parquet``, then ``tasks.index.name = "task"``; dataset_metadata.get_task_index looks a task string
    up in that index): the task strings must be the frame's pandas index, named by the file's pandas metadata,
    with ``task_index`` a column. Read here without pandas, from the metadata pandas itself follows."""
    table = pq.read_table(Path(root) / 'meta' / 'tasks.parquet')
    metadata = json.loads((table.schema.metadata or {}).get(b'pandas', b'{}'))
    index = metadata.get('index_columns')
    assert index == ['task'], f'tasks.parquet: pandas would read {index} as the index, not the task strings'
    assert [name for name in table.column_names if name not in index] == ['task_index'], table.column_names
    strings = table.column('task').to_pylist()
    assert all(isinstance(task, str) for task in strings) and len(set(strings)) == len(strings), strings
    return dict(zip(table.column('task_index').to_pylist(), strings))


def video_frames(root, key, chunk=0, file=0):
    """Every frame of one mp4 in decode order, with its time in seconds, as RGB uint8."""
    import av
    path = Path(root) / 'videos' / key / f'chunk-{chunk:03d}' / f'file-{file:03d}.mp4'
    out = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            out.append((float(frame.pts * stream.time_base), frame.to_ndarray(format='rgb24')))
    return out


def rgb_of(msg):
    """A sample-bag camera message as RGB: rgb8 rows with their step, or a JPEG through Pillow."""
    if hasattr(msg, 'format'):
        return np.asarray(Image.open(io.BytesIO(bytes(msg.data))).convert('RGB'))
    rows = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(msg.height, msg.step)
    return rows[:, :msg.width * 3].reshape(msg.height, msg.width, 3)


def newest_before(stream, time_ns, inclusive=False):
    """The last (t, value) of a time-ordered stream received before ``time_ns`` (at or before: inclusive)."""
    chosen = None
    for t, value in stream:
        if t < time_ns or (inclusive and t == time_ns):
            chosen = (t, value)
        else:
            break
    return chosen
