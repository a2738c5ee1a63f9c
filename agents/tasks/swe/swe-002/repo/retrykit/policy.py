"""Retry policies for flaky calls."""

from dataclasses import dataclass

DEFAULT_ATTEMPTS = 3


@dataclass
class RetryPolicy:
    """How often to try a call and which exceptions count as transient."""

    attempts: int = 1
    retry_on: tuple = (OSError,)

    def should_retry(self, attempt, error):
        return attempt < self.attempts and isinstance(error, self.retry_on)


def call_with_retry(func, policy=None):
    policy = policy or RetryPolicy()
    attempt = 0
    while True:
        attempt += 1
        try:
            return func()
        except Exception as error:  # noqa: BLE001 - the policy decides
            if not policy.should_retry(attempt, error):
                raise
