"""The error every MIL data module raises for an unusable slide file or table row."""


class SlideDataError(ValueError):
    """A slide file or a label / split table is unusable; the message names the slide or row."""
