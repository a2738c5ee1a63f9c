"""Plain-text ledger reports: parsing, formatting, column layout, totals and footer."""

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

CURRENCY = "EUR"
COLUMN_GAP = 2
MIN_WIDTHS = {"date": 10, "account": 8, "memo": 12, "amount": 10}


@dataclass
class Entry:
    date: str
    account: str
    memo: str
    amount: Decimal


class LedgerFormatError(ValueError):
    """A ledger line cannot be parsed."""


def parse_amount(text):
    """Decimal amount from '1,234.50', '-12' or '(12.00)' (parentheses mean negative)."""
    cleaned = text.strip().replace(",", "")
    negative = cleaned.startswith("(") and cleaned.endswith(")")
    if negative:
        cleaned = cleaned[1:-1]
    try:
        value = Decimal(cleaned)
    except ArithmeticError:
        raise LedgerFormatError(f"not an amount: {text!r}") from None
    return -value if negative else value


def parse_line(line):
    """An Entry from 'date;account;memo;amount'."""
    parts = [part.strip() for part in line.split(";")]
    if len(parts) != 4:
        raise LedgerFormatError(f"expected 4 fields, got {len(parts)}: {line!r}")
    date, account, memo, amount = parts
    if len(date) != 10 or date[4] != "-" or date[7] != "-":
        raise LedgerFormatError(f"bad date {date!r}; use YYYY-MM-DD")
    return Entry(date, account, memo, parse_amount(amount))


def parse_ledger(text):
    """Entries of every non-blank, non-comment line."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            entries.append(parse_line(stripped))
        except LedgerFormatError as exc:
            raise LedgerFormatError(f"line {number}: {exc}") from None
    return entries


def quantize(value):
    """Round half up to cents."""
    return value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def format_amount(value, currency=False):
    """'1,234.50' (or '1,234.50 EUR'); negative amounts in parentheses."""
    cents = quantize(abs(value))
    text = f"{cents:,.2f}"
    if value < 0:
        text = f"({text})"
    return f"{text} {CURRENCY}" if currency else text


def format_percent(part, whole):
    """Share of a whole as '12.5%'; '-' for an empty whole."""
    if whole == 0:
        return "-"
    share = quantize(Decimal(100) * part / whole)
    return f"{share.normalize():f}%"


def truncate(text, width):
    """Cut text to width, marking the cut with an ellipsis."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…"


def column_widths(entries):
    """Width of each column: the widest cell or the minimum."""
    widths = dict(MIN_WIDTHS)
    for entry in entries:
        widths["date"] = max(widths["date"], len(entry.date))
        widths["account"] = max(widths["account"], len(entry.account))
        widths["memo"] = max(widths["memo"], min(len(entry.memo), 30))
        widths["amount"] = max(widths["amount"], len(format_amount(entry.amount)))
    return widths


def pad(text, width, align="left"):
    if align == "right":
        return text.rjust(width)
    return text.ljust(width)


def render_header(widths):
    gap = " " * COLUMN_GAP
    cells = [
        pad("Date", widths["date"]),
        pad("Account", widths["account"]),
        pad("Memo", widths["memo"]),
        pad("Amount", widths["amount"], "right"),
    ]
    line = gap.join(cells)
    return [line, "-" * len(line)]


def render_row(entry, widths):
    gap = " " * COLUMN_GAP
    cells = [
        pad(entry.date, widths["date"]),
        pad(truncate(entry.account, widths["account"]), widths["account"]),
        pad(truncate(entry.memo, widths["memo"]), widths["memo"]),
        pad(format_amount(entry.amount), widths["amount"], "right"),
    ]
    return gap.join(cells)


def totals_by_account(entries):
    """Sum of amounts per account, accounts in first-seen order."""
    totals = {}
    for entry in entries:
        totals[entry.account] = totals.get(entry.account, Decimal(0)) + entry.amount
    return totals


def render_account_summary(entries):
    """One line per account with its total and share of the gross amount."""
    totals = totals_by_account(entries)
    gross = sum((abs(v) for v in totals.values()), Decimal(0))
    lines = []
    for account, total in totals.items():
        share = format_percent(abs(total), gross)
        lines.append(f"{account}: {format_amount(total, currency=True)} ({share})")
    return lines


def date_range(entries):
    """(first, last) date of the entries, or None."""
    if not entries:
        return None
    dates = sorted(entry.date for entry in entries)
    return dates[0], dates[0]


def render_title(entries, title):
    span = date_range(entries)
    if span is None:
        return [title, ""]
    first, last = span
    return [f"{title} ({first} to {last})", ""]


def net_total(entries):
    return sum((entry.amount for entry in entries), Decimal(0))


def average_amount(entries):
    """Mean amount per entry (zero for no entries)."""
    if not entries:
        return Decimal(0)
    return net_total(entries) / len(entries)


def render_footer(entries, widths):
    total_width = sum(widths.values()) + COLUMN_GAP * (len(widths) - 1)
    lines = ["=" * total_width]
    lines.append(f"entries: {len(entries)}")
    lines.append(f"net total: {format_amount(net_total(entries), currency=True)}")
    lines.append(f"average: {format_amount(average_amount(entries), currency=True)}")
    return lines


def render_report(entries, title="Ledger"):
    """The whole report: title, table, footer and per-account summary."""
    widths = column_widths(entries)
    lines = render_title(entries, title)
    lines += render_header(widths)
    lines += [render_row(entry, widths) for entry in entries]
    lines += render_footer(entries, widths)
    lines.append("")
    lines += render_account_summary(entries)
    return "\n".join(lines) + "\n"
