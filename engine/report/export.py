"""A run's metrics as a file people open elsewhere: CSV (spreadsheets, pandas) or Parquet
(typed columns, units in the schema metadata). Every stored metric column, every logged
step, in step order; the header carries the unit of every column whose name does not
(`loss [nats (cross-entropy)]`, `step_time_ms` as it is).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd

from engine.schema import METRIC_COLUMNS, METRIC_UNITS
from engine.store import Store


def metrics_frame(store: Store, run_id: str) -> pd.DataFrame:
    """Every logged step of the run, every metric column (no downsampling)."""
    store.get_run(run_id)  # RunNotFound for an unknown id
    return store.read_metrics(run_id, max_points=None, columns=METRIC_COLUMNS)


def header_name(column: str) -> str:
    unit = METRIC_UNITS.get(column)
    return f"{column} [{unit}]" if unit else column


def metrics_csv(store: Store, run_id: str) -> bytes:
    frame = metrics_frame(store, run_id).rename(columns=header_name)
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue().encode("utf-8")


def metrics_parquet(store: Store, run_id: str) -> bytes:
    """Parquet with the plain column names; units and the run id in the file metadata."""
    import pyarrow as pa  # streamlit's dependency; only this export needs it
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(metrics_frame(store, run_id), preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[b"precision_lab.run_id"] = run_id.encode()
    metadata[b"precision_lab.units"] = json.dumps(METRIC_UNITS).encode()
    buffer = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(metadata), buffer)
    return buffer.getvalue()


def write_metrics_file(store: Store, run_id: str, path: str | os.PathLike,
                       file_format: str) -> Path:
    """Write `csv` or `parquet` to `path` (atomically: a reader never sees half a file)."""
    data = metrics_csv(store, run_id) if file_format == "csv" else metrics_parquet(store, run_id)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path
