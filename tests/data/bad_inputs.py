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
