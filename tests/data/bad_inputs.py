"""Malformed input files for the dead-letter and bad-input tests (no dpsynth imports)."""

SECRET = "SECRETWORDS"  # text of the rejected records: must never be printed or written


def bad_csv(path, good=397):
    """The audit's file: `good` valid rows, one of invalid UTF-8, one with an empty label, one with an empty text
    (at data rows 11, 21 and 31)."""
    rows = [f"review number {i} good tasty,{'great' if i % 2 else 'other'}".encode() for i in range(good)]
    rows.insert(10, f"{SECRET} bad \xff bytes,great".encode("latin-1"))
    rows.insert(20, f"{SECRET} without a label,".encode())
    rows.insert(30, b",great")
    path.write_bytes(b"text,label\n" + b"\n".join(rows) + b"\n")
    return path


def _good_rows(n=8):
    return b"".join(b"review %d text,%s\n" % (i, b"great" if i % 2 else b"other") for i in range(n))


def write_case(directory, case):
    """Writes input file(s) for `case` under `directory`; returns (path, expected).

    `expected` is ("records", n_used, n_dead) when the file is read with n_dead counted dead
    letters, or ("error", substring) for a one-line fatal error (the substring names the problem).
    """
    import gzip
    import os

    d = str(directory)
    path = os.path.join(d, CASES[case][0])

    def w(data, name=None):
        p = os.path.join(d, name) if name else path
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    good = _good_rows()
    if case == "csv_bom":
        w(b"\xef\xbb\xbftext,label\n" + good)
    elif case == "csv_crlf":
        w((b"text,label\n" + good).replace(b"\n", b"\r\n"))
    elif case == "csv_quoted_newlines":
        w(b'text,label\n"line one\nline two",great\n' + good)
    elif case == "csv_unterminated_quote":
        w(b"text,label\n" + good + b'"never closed,great\nreview after,other\n')
    elif case == "csv_duplicate_header":
        w(b"text,text,label\n" + b"".join(b"a %d,b %d,great\n" % (i, i) for i in range(5)))
    elif case == "csv_missing_header":
        w(good)
    elif case == "csv_extra_columns":
        w(b"text,label,extra\n" + b"".join(b"r %d,great,x\n" % i for i in range(5)) + b"r 9,other,x,y\n")
    elif case == "csv_nul_bytes":
        w(b"text,label\n" + good + b"bad\x00text,great\n")
    elif case == "jsonl_broken_lines":
        w(b'{"text": "a", "label": "x"}\n{"text": "b", "label"\n{"text": "c", "label": "y"}\n{"text": "d", "label": "x"}\n')
    elif case == "jsonl_non_object_lines":
        w(b'{"text": "a", "label": "x"}\n[1, 2]\n"a string"\n{"text": "c", "label": "y"}\n{"text": "d", "label": "y"}\n')
    elif case == "jsonl_numeric_labels":
        w(b'{"text": "a", "label": 1}\n{"text": "b", "label": "1"}\n{"text": "c", "label": 0}\n{"text": "d", "label": 1.0}\n')
    elif case == "parquet_wrong_types":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": ["a", "b", "c", "d"], "label": [[1], [2], [1], [2]]}), path)
    elif case == "parquet_numeric_text":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [1, 2, 3], "label": ["a", "b", "a"]}), path)
    elif case == "gzip_truncated":
        data = gzip.compress(b"".join(b'{"text": "t %d", "label": "%s"}\n' % (i, b"xy"[i % 2:i % 2 + 1])
                                      for i in range(400)))
        w(data[: len(data) // 2])
    elif case == "empty_csv":
        w(b"")
    elif case == "empty_jsonl":
        w(b"")
    elif case == "csv_cp1252":  # a Windows-1252 spreadsheet export: read whole with encoding="cp1252"
        w(b"text,label\n" + good[:40] + "caf\u00e9 cr\u00e8me \u2013 fine,great\n".encode("cp1252") + good[40:]
          + "na\u00efve,other\n".encode("cp1252"))
    elif case == "dir_mixed_types":
        w(b'{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n', "mixed/a.jsonl")
        w(b"text,label\nc,y\nd,x\n", "mixed/b.csv")
        w(b"# notes\n", "mixed/notes.md")
    else:
        raise KeyError(case)
    return path, CASES[case][1]


# case -> (file or directory name, expected with read_sensitive)
CASES = {
    "csv_bom": ("bom.csv", ("records", 8, 0)),
    "csv_crlf": ("crlf.csv", ("records", 8, 0)),
    "csv_quoted_newlines": ("quoted.csv", ("records", 9, 0)),
    "csv_unterminated_quote": ("unterminated.csv", ("records", 8, 1)),
    "csv_duplicate_header": ("dup_header.csv", ("error", "duplicate column")),
    "csv_missing_header": ("no_header.csv", ("error", "missing column")),
    "csv_extra_columns": ("extra.csv", ("records", 5, 1)),
    "csv_nul_bytes": ("nul.csv", ("records", 8, 1)),
    "jsonl_broken_lines": ("broken.jsonl", ("records", 3, 1)),
    "jsonl_non_object_lines": ("nonobject.jsonl", ("records", 3, 2)),
    "jsonl_numeric_labels": ("numeric.jsonl", ("records", 4, 0)),
    "parquet_wrong_types": ("list_labels.parquet", ("error", "not a scalar")),
    "parquet_numeric_text": ("int_text.parquet", ("error", "is not a string")),
    "gzip_truncated": ("truncated.jsonl.gz", ("error", "truncated or corrupt")),
    "empty_csv": ("empty.csv", ("error", "empty CSV file")),
    "empty_jsonl": ("empty.jsonl", ("error", "no valid")),
    "dir_mixed_types": ("mixed", ("error", "unknown file type '.md'")),
    "csv_cp1252": ("cp1252.csv", ("records", 8, 2)),  # (UTF-8, the default; ("records", 10, 0) in cp1252)
}
