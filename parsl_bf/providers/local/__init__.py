from .provider import LocalBackfillProvider

__all__ = ["LocalBackfillProvider"]
