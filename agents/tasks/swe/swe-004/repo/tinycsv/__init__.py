from .reader import read_rows, split_row
