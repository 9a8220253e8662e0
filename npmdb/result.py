"""Query results (defined by the query layer, :mod:`npmdb.query.result`): a
:class:`Result` of :class:`Answer` rows, each with its :class:`Evidence`."""

from npmdb.query.result import Answer, Evidence, Result, StageStat

__all__ = ["Evidence", "Answer", "Result", "StageStat"]
