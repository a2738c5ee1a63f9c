import unittest
from decimal import Decimal

from ledger.report import average_amount, format_amount, parse_ledger, render_report

LEDGER = """# sample
2024-01-03; food; market; 10.00
2024-01-09; rent; January; 20.00
2024-01-15; food; bakery; 30.00
"""


class ReportTest(unittest.TestCase):
    def test_average(self):
        self.assertEqual(average_amount(parse_ledger(LEDGER)), Decimal("20"))

    def test_footer(self):
        report = render_report(parse_ledger(LEDGER))
        self.assertIn("average: 20.00 EUR", report)
        self.assertIn("net total: 60.00 EUR", report)

    def test_single_entry(self):
        self.assertEqual(average_amount(parse_ledger("2024-02-01; x; y; 7.50")), Decimal("7.50"))

    def test_title_range(self):
        report = render_report(parse_ledger(LEDGER))
        self.assertTrue(report.startswith("Ledger (2024-01-03 to 2024-01-15)"), report)

    def test_amount_format(self):
        self.assertEqual(format_amount(Decimal("-1234.5")), "(1,234.50)")


if __name__ == "__main__":
    unittest.main()
