import unittest

from accounts.users import User, display_name, sort_users


class DisplayNameTest(unittest.TestCase):
    def test_with_email(self):
        self.assertEqual(display_name(User("Ada", "ADA@Example.org")), "Ada <ada@example.org>")

    def test_without_email(self):
        self.assertEqual(display_name(User("ada", None)), "ada")

    def test_sorting(self):
        names = [u.name for u in sort_users([User("bob"), User("Alice")])]
        self.assertEqual(names, ["Alice", "bob"])


if __name__ == "__main__":
    unittest.main()
