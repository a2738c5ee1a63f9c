from .policy import RetryPolicy, call_with_retry

__all__ = ["RetryPolicy", "call_with_retry"]
