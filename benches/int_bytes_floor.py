"""Where an INT history's bytes go, and how low Parquet could take them.

Usage:
    STEL_INT_KEEP=/tmp/intkeep stel-bench int --quick   # keeps the end-to-end runs' files
    python3 benches/int_bytes_floor.py /tmp/intkeep/plain

For each column of `int_hops` and `int_reports` holding at least 0.3 B per report, in bytes per
report (all reports of the files):
  written  the column chunks as the daemon wrote them (compressed, as the footer counts them);
  lz4      the smallest of pyarrow's dictionary, DELTA_BINARY_PACKED, PLAIN and BYTE_STREAM_SPLIT
           encodings for that column alone, with LZ4 or no codec (the daemon's speed class);
  any      the same with zstd level 19 as well (far slower than the daemon could afford);
  entropy  the order-0 entropy of the column's values or of their differences, whichever is
           smaller, in the files' row order (what an ideal coder of each value on its own from
           its predecessor would need; a column coded without looking at other columns).
Smaller columns are summed as written. Footers and page headers of the written files are in
`written` only through the chunk sizes; the totals leave footers out.
"""

import collections
import glob
import io
import math
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FAST = [("DICT", "lz4"), ("DELTA_BINARY_PACKED", "none"), ("DELTA_BINARY_PACKED", "lz4"),
        ("PLAIN", "lz4"), ("BYTE_STREAM_SPLIT", "lz4")]
SLOW = [("DICT", "zstd"), ("DELTA_BINARY_PACKED", "zstd"), ("PLAIN", "zstd"),
        ("BYTE_STREAM_SPLIT", "zstd")]


def files(root, table):
    return sorted(glob.glob(f"{root}/table={table}/**/*.parquet", recursive=True))


def chunk_bytes(path, col):
    md = pq.ParquetFile(path).metadata
    i = md.schema.names.index(col)
    return sum(md.row_group(g).column(i).total_compressed_size for g in range(md.num_row_groups))


def encoded_bytes(arr, enc, codec):
    kw = dict(compression=codec, write_statistics=False, use_dictionary=enc == "DICT")
    if codec == "zstd":
        kw["compression_level"] = 19
    if enc != "DICT":
        kw["column_encoding"] = {"c": enc}
    out = io.BytesIO()
    try:
        pq.write_table(pa.table({"c": arr}), out, **kw)
    except (pa.ArrowException, ValueError):
        return None  # the encoding does not apply to this type
    md = pq.ParquetFile(io.BytesIO(out.getvalue())).metadata
    return sum(md.row_group(g).column(0).total_compressed_size for g in range(md.num_row_groups))


def entropy_bytes(arr):
    n = len(arr)
    if n == 0:
        return 0.0
    counts = pc.value_counts(arr).field("counts").to_pylist()
    return -sum(c / n * math.log2(c / n) for c in counts) * n / 8


def column_entropy(arr):
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    if not pa.types.is_integer(arr.type):
        return entropy_bytes(arr)
    x = arr.cast(pa.int64()).fill_null(-1)
    nulls = entropy_bytes(arr.is_null()) if arr.null_count else 0.0
    return min(entropy_bytes(pc.pairwise_diff(x)), entropy_bytes(x)) + nulls


def main(root):
    reports = sum(pq.ParquetFile(f).metadata.num_rows for f in files(root, "int_reports"))
    if reports == 0:
        sys.exit(f"no int_reports files under {root}")
    print(f"{reports} reports in {root}")
    print(f"{'table':12} {'column':20} {'written':>8} {'lz4':>7} {'any':>7} {'entropy':>8}  best of any")
    total = collections.Counter()
    for table in ["int_hops", "int_reports", "int_drops"]:
        fs = files(root, table)
        if not fs:
            continue
        for col in pq.ParquetFile(fs[0]).schema_arrow.names:
            written = sum(chunk_bytes(f, col) for f in fs)
            if written / reports < 0.3:
                for k in ["written", "lz4", "any", "entropy"]:
                    total[k] += written
                continue
            fast = slow = ent = 0
            how = collections.Counter()
            for f in fs:
                arr = pq.ParquetFile(f).read(columns=[col]).column(0).combine_chunks()
                sizes = {v: encoded_bytes(arr, *v) for v in FAST + SLOW}
                sizes = {v: s for v, s in sizes.items() if s is not None}
                fast += min(s for v, s in sizes.items() if v in FAST)
                best = min(sizes, key=sizes.get)
                slow += sizes[best]
                how[best] += 1
                ent += column_entropy(arr)
            for k, v in [("written", written), ("lz4", fast), ("any", slow), ("entropy", ent)]:
                total[k] += v
            print(f"{table:12} {col:20} {written / reports:8.2f} {fast / reports:7.2f} "
                  f"{slow / reports:7.2f} {ent / reports:8.2f}  {how.most_common(1)[0][0]}")
    print(f"{'all':33} {total['written'] / reports:8.2f} {total['lz4'] / reports:7.2f} "
          f"{total['any'] / reports:7.2f} {total['entropy'] / reports:8.2f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
