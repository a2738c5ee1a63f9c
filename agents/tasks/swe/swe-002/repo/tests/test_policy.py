import unittest

from retrykit import RetryPolicy, call_with_retry
from retrykit.policy import DEFAULT_ATTEMPTS


class Flaky:
    def __init__(self, failures):
        self.failures = failures
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError("transient")
        return "ok"


class RetryPolicyTest(unittest.TestCase):
    def test_default_attempts(self):
        self.assertEqual(RetryPolicy().attempts, DEFAULT_ATTEMPTS)

    def test_default_policy_survives_two_failures(self):
        flaky = Flaky(failures=2)
        self.assertEqual(call_with_retry(flaky), "ok")
        self.assertEqual(flaky.calls, 3)

    def test_non_transient_errors_are_raised(self):
        def boom():
            raise ValueError("bad")

        with self.assertRaises(ValueError):
            call_with_retry(boom, RetryPolicy(attempts=5))


if __name__ == "__main__":
    unittest.main()
