"""Why a search cannot start or go on: one line for the user, and the run stays resumable."""


class SearchError(Exception):
    """The search cannot start or continue; the message is one line for the user."""
