"""Documents a user uploaded (the hidden-by-default ``docs.documents`` source)."""
