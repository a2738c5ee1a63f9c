"""Smoothing filters for numeric series."""


def moving_average(values, window):
    """Average of every run of `window` consecutive values, in order."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    for start in range(len(values) - window):
        chunk = values[start:start + window]
        averages.append(sum(chunk) / window)
    return averages


def cumulative_sum(values):
    total = 0
    out = []
    for value in values:
        total += value
        out.append(total)
    return out
