"""The kernel table of a parsed trace, without pandas: one list per column.

Why not a DataFrame: the analysis reads the table column by column (sums, a sweep, groups
by name) and never needs pandas' machinery, while importing pandas is half of
`python -m engine kernels`' whole run on a small trace (0.37 s of 0.7 s). The table is
built from the parser's lists in one pass; `to_pandas()` gives the DataFrame the pages'
tables and `load_kernel_table` hand out.

Columns (TABLE_COLUMNS): name, dur_us, ts_us (floats), stream, device, correlation,
external_id (int or None), cpu_op (str or None), category, tensor_core, dtype (str or
None), reason. `attrs` carries the trace's source, device and defect counts.
"""

from __future__ import annotations

from typing import Any, Iterable

TABLE_COLUMNS = ("name", "dur_us", "ts_us", "stream", "device", "correlation", "external_id",
                 "cpu_op", "category", "tensor_core", "dtype", "reason")
_FLOAT_COLUMNS = ("dur_us", "ts_us")
_INT_COLUMNS = ("stream", "device", "correlation", "external_id")


class Column(list):
    """One column's values; `tolist()` as a pandas Series has, so the analysis reads a
    KernelTable and a DataFrame alike. The table's own list, not a copy (300k kernels:
    a copy per read cost more than the reading): callers only read it."""

    def tolist(self) -> list:
        return self


class KernelTable:
    """Rows of kernels in start order, stored as columns."""

    def __init__(self, columns: dict[str, list] | None = None, attrs: dict | None = None):
        self._columns = {name: Column((columns or {}).get(name, [])) for name in TABLE_COLUMNS}
        lengths = {len(values) for values in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self.attrs: dict[str, Any] = dict(attrs or {})
        # derived once per table (kernel groups): the breakdown and the explanation both use them
        self.memo: dict[str, Any] = {}

    @property
    def columns(self) -> tuple[str, ...]:
        return TABLE_COLUMNS

    def __len__(self) -> int:
        return len(self._columns["name"])

    @property
    def empty(self) -> bool:
        return len(self) == 0

    def __getitem__(self, name: str) -> Column:
        return self._columns[name]

    def rows(self, indices: Iterable[int]) -> "KernelTable":
        """The table of these rows (in the order given), with the same attrs."""
        indices = list(indices)
        return KernelTable({name: [values[i] for i in indices]
                            for name, values in self._columns.items()}, self.attrs)

    def to_pandas(self):
        """The same table as a DataFrame (the dtypes the pages and load_kernel_table have
        always had: float64 times, nullable Int64 ids, object text)."""
        import pandas as pd  # late: only the pages and load_kernel_table want a DataFrame

        data = {}
        for name in TABLE_COLUMNS:
            values = self._columns[name]
            if name in _FLOAT_COLUMNS:
                data[name] = pd.Series(values, dtype="float64")
            elif name in _INT_COLUMNS:
                data[name] = pd.array(values, dtype="Int64")
            elif name == "cpu_op":
                data[name] = pd.Series(values, dtype="object")
            else:
                data[name] = pd.Series(values)  # pandas' own text dtype, as parsed before
        frame = pd.DataFrame(data)
        frame.attrs.update(self.attrs)
        return frame
