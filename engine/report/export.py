"""A run's metrics as a file people open elsewhere: CSV (spreadsheets, pandas) or Parquet
(typed columns, units in the schema metadata). Every stored metric column, every logged
step, in step order; the header carries the unit of every column whose name does not
(`loss [nats (cross-entropy)]`, `step_time_ms` as it is).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
from pathlib import Path

import pandas as pd

from engine.schema import METRIC_COLUMNS, METRIC_UNITS
from engine.store import Store
from engine.store.db import default_home


def metrics_frame(store: Store, run_id: str) -> pd.DataFrame:
    """Every logged step of the run, every metric column (no downsampling)."""
    store.get_run(run_id)  # RunNotFound for an unknown id
    return store.read_metrics(run_id, max_points=None, columns=METRIC_COLUMNS)


# A workload's own loss function (docs/workloads.md) has its own units: cross-entropy in
# nats holds for the built-in models and the known architectures only.
WORKLOAD_LOSS_UNIT = "the workload's loss (its own units)"


def column_units(store: Store, run_id: str) -> dict[str, str]:
    """METRIC_UNITS for this run: a custom workload's loss is not labelled cross-entropy."""
    units = dict(METRIC_UNITS)
    if store.get_run(run_id).config.model == "custom":
        units["loss"] = WORKLOAD_LOSS_UNIT
    return units


def header_name(column: str, units: dict[str, str] | None = None) -> str:
    unit = (units or METRIC_UNITS).get(column)
    return f"{column} [{unit}]" if unit else column


def metrics_csv(store: Store, run_id: str) -> bytes:
    units = column_units(store, run_id)
    frame = metrics_frame(store, run_id).rename(columns=lambda c: header_name(c, units))
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
    metadata[b"precision_lab.units"] = json.dumps(column_units(store, run_id)).encode()
    buffer = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(metadata), buffer)
    return buffer.getvalue()


class ExportTargetError(ValueError):
    """The export target is not a place a regular file may be written (device, FIFO,
    socket, symbolic link, folder): refused before anything is written."""


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def inside_data_dir(path: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> bool:
    """Whether `path` (resolved: symbolic links in its folders followed) lies in the data
    directory (PRECISION_LAB_HOME unless given)."""
    home = Path(data_dir).expanduser().resolve() if data_dir else default_home()
    target = Path(path).expanduser()
    try:
        where = target.parent.resolve() / target.name
    except (OSError, RuntimeError):  # a folder loop: not ours to judge here
        return False
    return where == home or where.is_relative_to(home)


def target_problem(path: str | os.PathLike,
                   data_dir: str | os.PathLike | None = None) -> str | None:
    """Why an export must not write `path` (None: a new or an existing regular file).

    An export renames its temporary file over the target, which replaces whatever is
    there: run as root, `--csv /dev/null` would replace the machine's /dev/null. A symbolic
    link is refused too (the rename would replace the link, not write where it points).
    Nothing inside the data directory either: `--csv <data dir>/precision_lab.sqlite3`
    would replace the live database, and a run's worker.log or trace its own evidence."""
    if inside_data_dir(path, data_dir):
        home = Path(data_dir).expanduser().resolve() if data_dir else default_home()
        return (f"is inside the data directory {str(home)!r} (the runs' database, logs and "
                "traces); exports write outside it")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; give the real file's path"
    for is_kind, words in _KINDS:
        if is_kind(info.st_mode):
            return f"is {words}; exports write regular files only"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file; exports write regular files only"
    return None


def write_file_atomically(path: str | os.PathLike, data: bytes,
                          data_dir: str | os.PathLike | None = None) -> bool:
    """Write `data` to `path` so a reader never sees half a file: a temporary file beside
    it with the target's final permissions (an existing file's own, else the umask's),
    fsync, rename, fsync of the folder. Returns True when an existing file was replaced.
    Raises ExportTargetError for a target that is not a regular file or that lies inside
    the data directory (`data_dir`, else PRECISION_LAB_HOME)."""
    path = Path(path)
    problem = target_problem(path, data_dir)
    if problem is not None:
        raise ExportTargetError(f"{path}: {problem}")
    existed = path.exists()
    if existed:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # O_CREAT's mode is masked by the umask; an existing file's is not
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        folder = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return existed


def write_metrics_file(store: Store, run_id: str, path: str | os.PathLike,
                       file_format: str) -> Path:
    """Write `csv` or `parquet` to `path` (`write_file_atomically`: regular files only)."""
    data = metrics_csv(store, run_id) if file_format == "csv" else metrics_parquet(store, run_id)
    write_file_atomically(path, data, store.home)
    return Path(path)
