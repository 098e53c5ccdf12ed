"""The LMDB environment of a broker and the group commit that all its writes go through."""

from .environment import Storage
from .group_commit import GroupCommit
from .ops import WriteOp, combine

__all__ = ["Storage", "GroupCommit", "WriteOp", "combine"]
