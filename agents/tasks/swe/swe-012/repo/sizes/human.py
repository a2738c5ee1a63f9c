"""Human-readable byte sizes."""

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(num_bytes):
    value = float(num_bytes)
    for unit in UNITS[:-1]:
        if value <= 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {UNITS[-1]}"


def parse_size(text):
    number, unit = text.split()
    return int(float(number) * 1024 ** UNITS.index(unit))
