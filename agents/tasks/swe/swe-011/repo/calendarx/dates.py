"""Calendar arithmetic without the datetime module."""

MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year):
    return year % 4 == 0


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"invalid month: {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def day_of_year(year, month, day):
    return sum(days_in_month(year, m) for m in range(1, month)) + day
